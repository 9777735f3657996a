"""Rollout generation (the vLLM stand-in) and the padded batch layout shared by every phase.

Generation runs in chunks of ``max_num_seqs`` sequences, each with its own preallocated KV cache of
``prompt + max_response_length`` positions, and a chunk ends when all its sequences have emitted
<eos> (so the rollout time follows the longest sample, as in verl). Sampling uses Gumbel noise drawn
up front for the whole batch, so the samples do not depend on how the batch is chunked: system knobs
change the speed, not the trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mart.trial_runner.local.model import GPT, full_mask, positions
from mart.trial_runner.local.task import EOS, PAD


@dataclass
class Packed:
    """Prompts left-padded to ``P``, responses right-padded to ``R`` (verl's layout)."""

    ids: torch.Tensor  # (B, P + R) token ids
    valid: torch.Tensor  # (B, P + R) bool, False on padding
    resp_ids: torch.Tensor  # (B, R) the response tokens
    resp_mask: torch.Tensor  # (B, R) float, 1 on real response tokens
    P: int
    R: int


def pack(prompts: list[list[int]], responses: list[list[int]], device,
         pad_prompt_to: int | None = None, pad_response_to: int | None = None) -> Packed:
    """Lay out a micro-batch; without ``pad_*_to`` it is only as long as its longest prompt/response."""
    P = pad_prompt_to or max(len(p) for p in prompts)
    R = pad_response_to or max(max(len(r) for r in responses), 1)
    B = len(prompts)
    ids = torch.full((B, P + R), PAD, dtype=torch.long)
    valid = torch.zeros((B, P + R), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p) : P] = torch.tensor(p)
        valid[i, P - len(p) : P] = True
        if r:
            ids[i, P : P + len(r)] = torch.tensor(r)
            valid[i, P : P + len(r)] = True
    ids, valid = ids.to(device), valid.to(device)
    return Packed(ids, valid, ids[:, P:], valid[:, P:].float(), P, R)


def response_logits(model: GPT, b: Packed, temperature: float = 1.0, grad_checkpoint: bool = False) -> torch.Tensor:
    """Logits (B, R, vocab) that predicted each response token, divided by the sampling temperature."""
    logits = model(b.ids, positions(b.valid), full_mask(b.valid), grad_checkpoint=grad_checkpoint)
    logits = logits[:, b.P - 1 : b.P + b.R - 1].float()
    return logits / temperature if temperature != 1.0 else logits


def logprobs_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of ``tokens`` and the entropy of each predictive distribution."""
    logp = torch.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=generator).clamp_(1e-10, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def _pick(logits: torch.Tensor, noise: torch.Tensor | None, temperature: float, top_p: float) -> torch.Tensor:
    logits = logits.float().clone()
    logits[:, PAD] = float("-inf")  # <pad> only ever follows <eos>
    if noise is None:  # greedy
        return logits.argmax(-1)
    logits = logits / temperature
    if top_p < 1.0:  # nucleus: hide the tail beyond top_p of the mass (the top token always stays)
        probs, order = torch.softmax(logits, -1).sort(-1, descending=True)
        tail = (probs.cumsum(-1) - probs) > top_p
        hidden = torch.zeros_like(tail).scatter(-1, order, tail)
        logits = logits.masked_fill(hidden, float("-inf"))
    return (logits + noise).argmax(-1)  # Gumbel-max = a sample from softmax(logits)


@torch.no_grad()
def generate(
    model: GPT,
    prompts: list[list[int]],
    max_new: int,
    *,
    max_num_seqs: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Responses (token lists, ending in <eos> unless cut at ``max_new``); greedy when no generator."""
    device = model.wte.weight.device
    n = len(prompts)
    noise_all = None
    if generator is not None:
        noise_all = gumbel_noise((n, max_new, model.cfg.vocab_size), generator).to(device)
    out: list[list[int]] = []
    for s in range(0, n, max_num_seqs):
        chunk = prompts[s : s + max_num_seqs]
        B, P = len(chunk), max(len(p) for p in chunk)
        ids = torch.full((B, P), PAD, dtype=torch.long)
        valid = torch.zeros((B, P + max_new), dtype=torch.bool)
        for i, p in enumerate(chunk):
            ids[i, P - len(p) :] = torch.tensor(p)
            valid[i, P - len(p) : P] = True
        ids, valid = ids.to(device), valid.to(device)
        caches = model.new_cache(B, P + max_new)
        logits = model(ids, positions(valid[:, :P]), full_mask(valid[:, :P]), caches, 0)[:, -1]
        pos = valid.sum(-1, keepdim=True)
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        tokens = []
        for t in range(max_new):
            noise = noise_all[s : s + B, t] if noise_all is not None else None
            nxt = _pick(logits, noise, temperature, top_p).masked_fill(finished, PAD)
            tokens.append(nxt)
            valid[:, P + t] = ~finished
            finished = finished | (nxt == EOS)
            if t == max_new - 1 or bool(finished.all()):
                break
            mask = valid[:, None, None, : P + t + 1]
            logits = model(nxt[:, None], pos, mask, caches, P + t)[:, -1]
            pos = pos + 1
        for row in torch.stack(tokens, 1).tolist():
            resp = []
            for tok in row:
                if tok == PAD:
                    break
                resp.append(tok)
                if tok == EOS:
                    break
            out.append(resp)
    return out
