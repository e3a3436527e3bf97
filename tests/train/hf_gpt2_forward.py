#!/usr/bin/env python3
"""GPT-2's forward pass in plain PyTorch, reading a Hugging Face GPT-2 folder the way
transformers' GPT2LMHeadModel does (config.json, model.safetensors), written independently of
tandem to check `tandem export --format hf`: Debian ships no `transformers`.

Usage: hf_gpt2_forward.py FOLDER TOKENS OUT
  TOKENS  comma-separated token ids, one sequence
  OUT     the logits written as float64 little-endian, (len(TOKENS), vocab_size), row-major

The safetensors header is parsed with json and struct (the format: an 8-byte little-endian
header length, the JSON header, the data). The forward runs in float64.
"""
import json
import math
import os
import struct
import sys

import torch


def read_safetensors(path):
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtypes[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).to(torch.float64)
    return tensors


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward(cfg, w, ids):
    eps = cfg["layer_norm_epsilon"]
    C, H = cfg["n_embd"], cfg["n_head"]
    T = len(ids)

    def p(name):
        # GPT2LMHeadModel's names; the hub's older files name GPT2Model's, without the prefix.
        return w["transformer." + name] if "transformer." + name in w else w[name]

    def ln(x, prefix):
        return torch.nn.functional.layer_norm(x, (C,), p(prefix + ".weight"), p(prefix + ".bias"), eps)

    def conv1d(x, prefix):  # HF's Conv1D: weight (in, out), y = x W + b
        return x @ p(prefix + ".weight") + p(prefix + ".bias")

    idx = torch.tensor(ids, dtype=torch.long)
    x = p("wte.weight")[idx] + p("wpe.weight")[torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(T, H, C // H).transpose(0, 1) for t in (q, k, v))  # (H, T, hs)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + conv1d(y, h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    x = ln(x, "ln_f")
    head = w["lm_head.weight"] if "lm_head.weight" in w else p("wte.weight")  # tied
    return x @ head.T


def main():
    folder, tokens, out = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new", cfg
    assert cfg.get("n_inner") is None and cfg.get("tie_word_embeddings", True), cfg
    w = read_safetensors(os.path.join(folder, "model.safetensors"))
    ids = [int(t) for t in tokens.split(",")]
    logits = forward(cfg, w, ids)
    assert logits.shape == (len(ids), cfg["vocab_size"]), logits.shape
    with open(out, "wb") as f:
        values = logits.flatten().tolist()
        f.write(struct.pack(f"<{len(values)}d", *values))


if __name__ == "__main__":
    main()
