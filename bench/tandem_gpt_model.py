"""tandem's GPT-2 (nn/) written in PyTorch, shared by the PyTorch sides of the benchmarks.

Pre-LayerNorm blocks, fused QKV, causal attention, tanh-GELU MLP of 4x width, tied LM head,
byte vocabulary, GPT-2's initialisation exactly as nn::gpt_init (src/nn/gpt_params.cc) does it:
weights normal(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj) normal(0, 0.02 /
sqrt(2 * layers)), biases 0, LayerNorm weights 1 and biases 0. Imports torch: callers check for
it first, so that they can skip with a message when it is absent.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def causal_attention(q, k, v, drop):
    """softmax(q k^T / sqrt(hs), causal) v for (B, H, T, hs) operands: PyTorch 1.13's unfused
    path (the whole T x T square, the upper triangle masked), as GPT-2's reference code does."""
    t, hs = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, H, T, T)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return drop(att) @ v


class Block(nn.Module):
    def __init__(self, c, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        self.drop = nn.Dropout(dropout)

    def attention(self, x):
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.c_attn(x).split(c, dim=2)
        hs = c // self.heads
        q = q.view(b, t, self.heads, hs).transpose(1, 2)  # (B, H, T, hs)
        k = k.view(b, t, self.heads, hs).transpose(1, 2)
        v = v.view(b, t, self.heads, hs).transpose(1, 2)
        y = causal_attention(q, k, v, self.drop).transpose(1, 2).contiguous().view(b, t, c)
        return self.drop(self.c_proj(y))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.drop(self.mlp_proj(h))


class GPT(nn.Module):
    def __init__(self, vocab, positions, layers, c, heads, dropout):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(positions, c)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(c, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        # GPT-2's initialisation, as tandem's gpt_init (LayerNorm keeps PyTorch's ones and zeros).
        std_resid = 0.02 / math.sqrt(2.0 * max(layers, 1))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        for block in self.h:
            nn.init.normal_(block.c_proj.weight, std=std_resid)
            nn.init.normal_(block.mlp_proj.weight, std=std_resid)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.drop(self.wte(tokens) + self.wpe(torch.arange(t)))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the LM head tied to wte: (B, T, vocab)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class RMSNorm(nn.Module):
    """Llama's RMSNorm (PyTorch 1.13 has none): x / sqrt(mean(x^2) + eps) * weight, in f32."""

    def __init__(self, c, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    """A Llama block as tandem's (nn/, arch llama): RMSNorm, grouped-query attention with rotary
    positions (Hugging Face's rotate_half convention), a SwiGLU MLP, no biases."""

    def __init__(self, c, heads, kv_heads, ffn, eps):
        super().__init__()
        self.heads, self.kv_heads, self.hs = heads, kv_heads, c // heads
        self.input_layernorm = RMSNorm(c, eps)
        self.q_proj = nn.Linear(c, c, bias=False)
        self.k_proj = nn.Linear(c, kv_heads * self.hs, bias=False)
        self.v_proj = nn.Linear(c, kv_heads * self.hs, bias=False)
        self.o_proj = nn.Linear(c, c, bias=False)
        self.post_attention_layernorm = RMSNorm(c, eps)
        self.gate_proj = nn.Linear(c, ffn, bias=False)
        self.up_proj = nn.Linear(c, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, c, bias=False)

    def attention(self, x, cos, sin):
        b, t, c = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.hs).transpose(1, 2)  # (B, H, T, hs)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads  # each key/value head serves `group` query heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        y = causal_attention(q, k, v, lambda att: att).transpose(1, 2).contiguous().view(b, t, c)
        return self.o_proj(y)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """tandem's Llama (tied head, byte vocabulary), initialised as GPT (normal(0, 0.02), the
    residual projections scaled by 1 / sqrt(2 * layers), norms 1)."""

    def __init__(self, vocab, layers, c, heads, kv_heads, ffn, theta=10000.0, eps=1e-5):
        super().__init__()
        self.hs, self.theta = c // heads, theta
        self.embed_tokens = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList(
            [LlamaBlock(c, heads, kv_heads, ffn, eps) for _ in range(layers)])
        self.norm = RMSNorm(c, eps)
        std_resid = 0.02 / math.sqrt(2.0 * max(layers, 1))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        for block in self.layers:
            nn.init.normal_(block.o_proj.weight, std=std_resid)
            nn.init.normal_(block.down_proj.weight, std=std_resid)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hs, 2).float() / self.hs))
        angles = torch.outer(torch.arange(t).float(), inv)  # (T, hs/2)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed_tokens(tokens)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.norm(x) @ self.embed_tokens.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
