"""A small GPT-style decoder-only transformer, after nanoGPT.

Attention is written out with matmul, masked_fill and softmax (no fused or flash kernels)
so a traced step is plain ATen ops whose (B, heads, T, T) attention maps dominate memory,
and dropout sits in the attention and residual paths so recomputation must replay RNG.
Input: int64 token ids (B, T) with T <= max_len; output: logits (B, T, vocab_size).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier ones."""

    def __init__(self, width: int, n_heads: int, max_len: int, dropout: float) -> None:
        super().__init__()
        if width % n_heads:
            raise ValueError(f"width {width} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        future = torch.ones(max_len, max_len, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(c // self.n_heads)
        scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
        weights = self.attn_drop(torch.softmax(scores, dim=-1))
        y = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, c)
        return self.resid_drop(self.proj(y))


class MLP(nn.Sequential):
    """Position-wise feed-forward: widen 4x, GELU, narrow, dropout."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__(
            nn.Linear(width, 4 * width),
            nn.GELU(),
            nn.Linear(4 * width, width),
            nn.Dropout(dropout),
        )


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, n_heads: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, n_heads, max_len, dropout)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = MLP(width, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, `n_layers` blocks, final LayerNorm, tied head."""

    def __init__(
        self,
        vocab_size: int = 512,
        n_layers: int = 4,
        n_heads: int = 4,
        width: int = 128,
        max_len: int = 256,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.tok_emb = nn.Embedding(vocab_size, width)
        self.pos_emb = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(
            Block(width, n_heads, max_len, dropout) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.apply(_init_weights)
        self.head.weight = self.tok_emb.weight  # tied after init: one tensor, two uses

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} is longer than max_len {self.max_len}")
        positions = torch.arange(t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _init_weights(module: nn.Module) -> None:
    """GPT-2 style small normal init, so tied logits start near zero rather than huge."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def gpt(**overrides: int | float) -> GPT:
    """Factory for the sample registry: GPT's defaults give ~0.9 M parameters."""
    return GPT(**overrides)
