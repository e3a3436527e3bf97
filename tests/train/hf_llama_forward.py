#!/usr/bin/env python3
"""Llama's forward pass in plain PyTorch, reading a Hugging Face Llama or Qwen2 folder the way
transformers' LlamaForCausalLM and Qwen2ForCausalLM do (config.json, model.safetensors or the
shards model.safetensors.index.json names), written independently of tandem to check `tandem
export --format hf`: Debian ships no `transformers`.

Usage: hf_llama_forward.py FOLDER TOKENS OUT
  TOKENS  comma-separated token ids, one sequence
  OUT     the logits written as float64 little-endian, (len(TOKENS), vocab_size), row-major,
          then one float64: the mean cross-entropy of predicting each token from those before it

As transformers computes it: RMSNorm, rotary positions in the rotate_half convention (the head's
two halves rotated as pairs (i, i + hs/2)), with Llama 3.1's "llama3" frequency scaling when
rope_scaling says so, grouped-query attention (repeat_kv: query head h reads key/value head
h // (heads / kv_heads)), SwiGLU (down(silu(gate(x)) * up(x))), nn.Linear weights (out, in), q/k/v
biases in a Qwen2 folder, the head tied to embed_tokens unless lm_head.weight is stored and
tie_word_embeddings is false. The safetensors header is parsed with json and struct. The forward
runs in float64.
"""
import json
import math
import os
import struct
import sys

import torch

from hf_gpt2_forward import read_safetensors  # beside this file


def read_weights(folder):
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    w = {}
    for name in files:
        w.update(read_safetensors(os.path.join(folder, name)))
    return w


def inv_freq(cfg, hs):
    # transformers' _compute_default_rope_parameters and _compute_llama3_parameters.
    base = cfg.get("rope_theta", 10000.0)
    freq = 1.0 / (base ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    r = cfg.get("rope_scaling")
    if r is None or r.get("rope_type", r.get("type")) == "default":
        return freq
    assert r.get("rope_type", r.get("type")) == "llama3", r
    factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
    old = r["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def forward(cfg, w, ids):
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    hs = C // H
    eps = cfg.get("rms_norm_eps", 1e-6)
    T = len(ids)
    qwen2 = cfg["model_type"] == "qwen2"

    def rmsnorm(x, name):
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def linear(x, name, bias=False):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    # The angles as transformers forms them: the f32 product of position and inv_freq.
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq(cfg, hs)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(torch.float64), emb.sin().to(torch.float64)  # (T, hs)

    x = w["model.embed_tokens.weight"][torch.tensor(ids, dtype=torch.long)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, p + "input_layernorm.weight")
        q = linear(h, p + "self_attn.q_proj", qwen2).view(T, H, hs).transpose(0, 1)
        k = linear(h, p + "self_attn.k_proj", qwen2).view(T, KV, hs).transpose(0, 1)
        v = linear(h, p + "self_attn.v_proj", qwen2).view(T, KV, hs).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=0)  # repeat_kv
        v = v.repeat_interleave(H // KV, dim=0)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + linear(y, p + "self_attn.o_proj")
        h = rmsnorm(x, p + "post_attention_layernorm.weight")
        gate, up = linear(h, p + "mlp.gate_proj"), linear(h, p + "mlp.up_proj")
        x = x + linear(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
    x = rmsnorm(x, "model.norm.weight")
    tied = cfg.get("tie_word_embeddings", False)
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return x @ head.T


def main():
    folder, tokens, out = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] in ("llama", "qwen2"), cfg
    assert cfg.get("hidden_act", "silu") == "silu", cfg
    assert not cfg.get("attention_bias", False) and not cfg.get("mlp_bias", False), cfg
    w = read_weights(folder)
    ids = [int(t) for t in tokens.split(",")]
    logits = forward(cfg, w, ids)
    assert logits.shape == (len(ids), cfg["vocab_size"]), logits.shape
    # Each position predicts the next token; the last has no target.
    loss = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:], dtype=torch.long))
    with open(out, "wb") as f:
        values = logits.flatten().tolist() + [loss.item()]
        f.write(struct.pack(f"<{len(values)}d", *values))


if __name__ == "__main__":
    main()
