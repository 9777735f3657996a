"""The policy: a small decoder-only transformer (nanoGPT-like) with a KV cache for rollouts.

Sequences are laid out as verl lays them out: the prompt left-padded, the response right-padded, with
a validity mask; position ids count valid tokens only, so padding never shifts a token's position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    block_size: int = 64  # longest prompt + response the model can see (learned positions)
    vocab_size: int = 14  # ten digits + <pad> <bos> <sep> <eos>
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 128


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: tuple | None = None, start: int = 0):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # write this chunk into the preallocated cache, attend over all so far
            k_buf, v_buf = cache
            k_buf[:, :, start : start + T] = k
            v_buf[:, :, start : start + T] = v
            k, v = k_buf[:, :, : start + T], v_buf[:, :, : start + T]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: tuple | None = None, start: int = 0):
        x = x + self.attn(self.ln_1(x), mask, cache, start)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # scaled init of the residual projections (GPT-2)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        caches: list | None = None,
        start: int = 0,
        grad_checkpoint: bool = False,
    ) -> torch.Tensor:
        """Logits (B, T, vocab) for tokens ``idx`` at positions ``pos`` under the boolean ``mask``."""
        x = self.wte(idx) + self.wpe(pos)
        for i, block in enumerate(self.h):
            cache = caches[i] if caches is not None else None
            if grad_checkpoint and torch.is_grad_enabled():
                x = checkpoint(block, x, mask, cache, start, use_reentrant=False)
            else:
                x = block(x, mask, cache, start)
        return self.lm_head(self.ln_f(x))

    def new_cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Preallocated KV cache for ``batch`` sequences of up to ``length`` tokens (like vLLM's blocks)."""
        c = self.cfg
        shape = (batch, c.n_head, length, c.n_embd // c.n_head)
        dev, dt = self.wte.weight.device, self.wte.weight.dtype
        return [(torch.empty(shape, device=dev, dtype=dt), torch.empty(shape, device=dev, dtype=dt)) for _ in self.h]


def positions(valid: torch.Tensor) -> torch.Tensor:
    """Position ids that count valid tokens only (left padding does not shift the prompt)."""
    return (valid.long().cumsum(-1) - 1).clamp(min=0)


def full_mask(valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) attention mask: causal, padding keys hidden; every token may see itself."""
    T = valid.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=valid.device)
    return (causal & valid[:, None, None, :]) | eye
