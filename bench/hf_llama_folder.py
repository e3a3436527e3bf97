#!/usr/bin/env python3
"""A Hugging Face Llama folder as the hub publishes one (config.json, model.safetensors in bf16,
untied lm_head.weight), written by plain PyTorch, not by tandem: the starting point of the
fine-tune benchmark (bench/run_finetune.sh), since no published checkpoint can be downloaded
here. The weights are random (normal, std 0.02; the norms' weights 1), from --seed.

Usage: hf_llama_folder.py OUT --vocab V [--layers L --d-model C --heads H --kv-heads K --ffn F
                          --rope-theta R --max-positions P --seed S]
The defaults are SmolLM-135M's shape (30 x 576, 9 heads, 3 key/value heads, SwiGLU 1536).
"""
import argparse
import json
import os
import struct

import torch


def write_safetensors(path, tensors):
    # The format: an 8-byte little-endian header length, the JSON header (each tensor's dtype,
    # shape and byte range), then the tensors' bytes back to back.
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--d-model", type=int, default=576)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--max-positions", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    C, hs = a.d_model, a.d_model // a.heads

    def normal(*shape):
        return (torch.randn(*shape) * 0.02).to(torch.bfloat16)

    w = {"model.embed_tokens.weight": normal(a.vocab, C)}
    for i in range(a.layers):
        b = f"model.layers.{i}."
        w[b + "input_layernorm.weight"] = torch.ones(C, dtype=torch.bfloat16)
        w[b + "self_attn.q_proj.weight"] = normal(a.heads * hs, C)
        w[b + "self_attn.k_proj.weight"] = normal(a.kv_heads * hs, C)
        w[b + "self_attn.v_proj.weight"] = normal(a.kv_heads * hs, C)
        w[b + "self_attn.o_proj.weight"] = normal(C, a.heads * hs)
        w[b + "post_attention_layernorm.weight"] = torch.ones(C, dtype=torch.bfloat16)
        w[b + "mlp.gate_proj.weight"] = normal(a.ffn, C)
        w[b + "mlp.up_proj.weight"] = normal(a.ffn, C)
        w[b + "mlp.down_proj.weight"] = normal(C, a.ffn)
    w["model.norm.weight"] = torch.ones(C, dtype=torch.bfloat16)
    w["lm_head.weight"] = normal(a.vocab, C)

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.vocab,
        "hidden_size": C,
        "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": a.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": a.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(a.out, "model.safetensors"), w)
    n = sum(t.numel() for t in w.values())
    print(f"wrote {a.out}: LlamaForCausalLM, {a.layers} x {C}, {n / 1e6:.1f} M parameters, bf16")


if __name__ == "__main__":
    main()
