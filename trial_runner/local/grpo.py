"""One GRPO step as verl runs it, phase by phase, each phase timed on its own (``timing.py``).

    gen           rollout: sample rollout.n responses per prompt (chunks of max_num_seqs)
    reward        rule-based verifier
    old_log_prob  actor forward, micro-batched (rollout.log_prob_micro_batch_size_per_gpu)
    ref           frozen reference forward when use_kl_loss (ref.log_prob_micro_batch_size_per_gpu)
    adv           group-normalised advantages (GRPO)
    update_actor  ppo_epochs x mini-batches (ppo_mini_batch_size x n sequences), each accumulated over
                  micro-batches (fixed size, or by token count with use_dynamic_bsz); clipped surrogate,
                  KL loss, entropy bonus, grad clip, AdamW

Losses are normalised over the whole mini-batch (not per micro-batch), so micro-batching changes the
speed and the memory, not the maths.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable
from functools import partial

import torch

from mart.trial_runner.local import task as T
from mart.trial_runner.local.config import LocalConfig
from mart.trial_runner.local.model import GPT, GPTConfig
from mart.trial_runner.local.rollout import generate, logprobs_entropy, pack, response_logits
from mart.trial_runner.local.timing import Timer


def model_config(cfg: LocalConfig) -> GPTConfig:
    return GPTConfig(block_size=cfg.block_size, vocab_size=T.VOCAB_SIZE, n_layer=cfg.n_layer,
                     n_head=cfg.n_head, n_embd=cfg.n_embd)


def task_config(cfg: LocalConfig) -> T.TaskConfig:
    return T.TaskConfig(name=cfg.task, min_digits=cfg.min_digits, max_digits=cfg.max_digits, val_size=cfg.val_size)


def get_lr(it: int, total: int, cfg: LocalConfig) -> float:
    """Learning rate of optimizer step ``it`` of ``total`` (linear warm-up, then constant or cosine)."""
    warmup = cfg.lr_warmup_steps if cfg.lr_warmup_steps > 0 else int(cfg.lr_warmup_steps_ratio * total)
    if it < warmup:
        return cfg.lr * (it + 1) / warmup
    if cfg.lr_scheduler_type == "constant":
        return cfg.lr
    progress = min(1.0, (it - warmup) / max(1, total - warmup))
    floor = cfg.min_lr_ratio * cfg.lr
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def micro_batches(lengths: list[int], idx: list[int], size: int | None, max_tokens: int | None) -> list[list[int]]:
    """Split ``idx`` into micro-batches: fixed ``size``, or (``max_tokens``) packed by token count.

    The token packing sorts by length and fills each micro-batch up to ``max_tokens`` actual tokens, as
    verl's ``rearrange_micro_batches`` balances them; a single sequence always fits (checked upfront).
    """
    if max_tokens is None:
        assert size is not None
        return [idx[i : i + size] for i in range(0, len(idx), size)]
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in sorted(idx, key=lambda j: -lengths[j]):
        if cur and used + lengths[i] > max_tokens:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += lengths[i]
    if cur:
        out.append(cur)
    return out


def grpo_advantages(scores: torch.Tensor, n: int, norm_by_std: bool, eps: float = 1e-6) -> torch.Tensor:
    """Each sample's reward centred on its prompt's group of ``n`` (and divided by the group's std)."""
    groups = scores.view(-1, n)
    centred = groups - groups.mean(-1, keepdim=True)
    if norm_by_std:
        centred = centred / (groups.std(-1, keepdim=True) + eps)
    return centred.reshape(-1)


def advantage_token_mean(adv: torch.Tensor, mask: torch.Tensor) -> float:
    """verl's ``critic/advantages/mean``: the mean over valid response tokens (a long response counts once per
    token), not over sequences (``metric_utils.compute_data_metrics``)."""
    return float((adv.unsqueeze(-1) * mask).sum() / mask.sum())


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """verl's ``kl_penalty``: per-token estimate of KL(pi || pi_ref)."""
    if kind == "kl":
        return logp - ref_logp
    if kind == "abs":
        return (logp - ref_logp).abs()
    if kind == "mse":
        return 0.5 * (logp - ref_logp).square()
    kl = (ref_logp - logp).clamp(-20, 20)  # low_var_kl (k3), clamped as in verl
    return (kl.exp() - kl - 1).clamp(-10, 10)


def agg(loss: torch.Tensor, mask: torch.Tensor, mode: str, n_tokens: float, n_seqs: int, horizon: int) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss under ``loss_agg_mode`` (shares sum to the whole)."""
    masked = loss * mask
    if mode == "token-mean":
        return masked.sum() / n_tokens
    if mode == "token-sum":
        return masked.sum()
    if mode == "seq-mean-token-sum":
        return masked.sum(-1).sum() / n_seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / n_seqs
    return masked.sum(-1).sum() / (n_seqs * horizon)  # seq-mean-token-sum-norm


class GRPOTrainer:
    """The actor, the frozen reference, the optimizer and the data stream of one trial."""

    def __init__(self, cfg: LocalConfig, base_state: dict, device: torch.device, total_steps: int) -> None:
        self.cfg, self.device = cfg, device
        self.task = task_config(cfg)
        torch.manual_seed(cfg.seed)
        self.actor = GPT(model_config(cfg)).to(device)
        self.actor.load_state_dict(base_state)
        self.ref = None
        if cfg.use_kl_loss:
            self.ref = copy.deepcopy(self.actor).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.actor.parameters(), lr=cfg.lr, betas=(0.9, 0.999),
                                     weight_decay=cfg.weight_decay)
        self.rng = random.Random(cfg.seed)  # prompt order
        self.sampler = torch.Generator().manual_seed(cfg.seed)  # rollout sampling noise
        self.val_sampler_seed = cfg.seed + 1
        self.val_digits = T.val_set(self.task)
        self.opt_steps_per_step = (cfg.train_batch_size // cfg.ppo_mini_batch_size) * cfg.ppo_epochs
        self.total_opt_steps = total_steps * self.opt_steps_per_step
        self.opt_step = 0
        self.probe: Callable[[], object] = lambda: None  # memory sampling at activation peaks

    # --- helpers ----------------------------------------------------------------------------------------
    def _pads(self) -> tuple[int | None, int | None]:
        c = self.cfg
        return (None, None) if c.use_remove_padding else (c.max_prompt_length, c.max_response_length)

    def _micro(self, lengths: list[int], idx: list[int], size: int | None) -> list[list[int]]:
        c = self.cfg
        if c.use_dynamic_bsz:
            return micro_batches(lengths, idx, None, c.ppo_max_token_len_per_gpu)
        return micro_batches(lengths, idx, size, None)

    @torch.no_grad()
    def _log_probs(self, model: GPT, prompts, responses, lengths, size, want_entropy: bool):
        """Per-token log-probs (N, R) of the responses under ``model``, micro-batched; and entropies."""
        N, R = len(prompts), max(len(r) for r in responses)
        logp = torch.zeros(N, R, device=self.device)
        ent = torch.zeros(N, R, device=self.device)
        pp, pr = self._pads()
        for mb in self._micro(lengths, list(range(N)), size):
            b = pack([prompts[i] for i in mb], [responses[i] for i in mb], self.device, pp, pr)
            lp, e = logprobs_entropy(response_logits(model, b, self.cfg.temperature), b.resp_ids)
            self.probe()
            r = min(R, b.R)
            logp[mb, :r] = lp[:, :r]
            if want_entropy:
                ent[mb, :r] = e[:, :r]
        return logp, ent

    # --- one step -------------------------------------------------------------------------------------
    def step(self, timer: Timer) -> dict[str, float]:
        c, dev = self.cfg, self.device
        n = c.rollout_n
        digits = [T.sample_digits(self.rng, self.task, "train") for _ in range(c.train_batch_size)]
        digits = [d for d in digits for _ in range(n)]  # interleaved repeat, as verl
        prompts = [T.encode_prompt(d) for d in digits]
        N = len(prompts)

        with timer.phase("gen"):
            self.actor.eval()
            responses = generate(self.actor, prompts, c.max_response_length, max_num_seqs=c.max_num_seqs,
                                 temperature=c.temperature, top_p=c.top_p, generator=self.sampler)
            responses = [r if r else [T.EOS] for r in responses]  # never empty (max_response_length >= 1)
        with timer.phase("reward"):
            scores = torch.tensor([T.task_score(self.task, d, r) for d, r in zip(digits, responses)], device=dev)

        lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
        R = max(len(r) for r in responses)
        resp_mask = torch.zeros(N, R, device=dev)
        for i, r in enumerate(responses):
            resp_mask[i, : len(r)] = 1.0

        with timer.phase("old_log_prob"):
            old_logp, ent = self._log_probs(self.actor, prompts, responses, lengths,
                                            c.rollout_log_prob_micro_batch_size_per_gpu, want_entropy=True)
        ref_logp = None
        if self.ref is not None:
            with timer.phase("ref"):
                ref_logp, _ = self._log_probs(self.ref, prompts, responses, lengths,
                                              c.ref_log_prob_micro_batch_size_per_gpu, want_entropy=False)

        with timer.phase("adv"):
            adv = grpo_advantages(scores, n, c.norm_adv_by_std_in_grpo)

        with timer.phase("update_actor"):
            upd = self._update(prompts, responses, lengths, resp_mask, old_logp, ref_logp, adv)

        n_tok = resp_mask.sum()
        resp_len = resp_mask.sum(-1)
        prompt_len = torch.tensor([float(len(p)) for p in prompts])
        metrics = {
            "actor/entropy": float((ent * resp_mask).sum() / n_tok),
            **upd,
            "critic/score/mean": float(scores.mean()),
            "critic/score/max": float(scores.max()),
            "critic/score/min": float(scores.min()),
            "critic/rewards/mean": float(scores.mean()),
            "critic/advantages/mean": advantage_token_mean(adv, resp_mask),
            "critic/advantages/max": float(adv.max()),
            "critic/advantages/min": float(adv.min()),
            "response_length/mean": float(resp_len.mean()),
            "response_length/max": float(resp_len.max()),
            "response_length/min": float(resp_len.min()),
            "response_length/clip_ratio": float((resp_len >= c.max_response_length).float().mean()),
            "prompt_length/mean": float(prompt_len.mean()),
            "prompt_length/max": float(prompt_len.max()),
            "prompt_length/min": float(prompt_len.min()),
            "perf/total_num_tokens": int(sum(lengths)),
        }
        return metrics

    def _update(self, prompts, responses, lengths, resp_mask, old_logp, ref_logp, adv) -> dict[str, float]:
        c = self.cfg
        n_seqs_mini = c.ppo_mini_batch_size * c.rollout_n
        N = len(prompts)
        pp, pr = self._pads()
        params = [p for p in self.actor.parameters() if p.requires_grad]
        sums = {"pg_loss": 0.0, "pg_clipfrac": 0.0, "ppo_kl": 0.0, "kl_loss": 0.0, "grad_norm": 0.0}
        n_mini = 0
        self.actor.train()
        for _ in range(c.ppo_epochs):
            for s in range(0, N, n_seqs_mini):
                mini = list(range(s, min(N, s + n_seqs_mini)))
                tokens = float(resp_mask[mini].sum().clamp(min=1))
                lr = get_lr(self.opt_step, self.total_opt_steps, c)
                for group in self.opt.param_groups:
                    group["lr"] = lr
                self.opt.zero_grad(set_to_none=True)
                m = {k: 0.0 for k in ("pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss")}
                for mb in self._micro(lengths, mini, c.ppo_micro_batch_size_per_gpu):
                    b = pack([prompts[i] for i in mb], [responses[i] for i in mb], self.device, pp, pr)
                    r = min(b.R, resp_mask.shape[1])
                    logits = response_logits(self.actor, b, c.temperature, c.enable_gradient_checkpointing)
                    logp, ent = logprobs_entropy(logits[:, :r], b.resp_ids[:, :r])
                    mask, old, a = resp_mask[mb, :r], old_logp[mb, :r], adv[mb].unsqueeze(-1)
                    aggf = partial(agg, mask=mask, mode=c.loss_agg_mode, n_tokens=tokens, n_seqs=len(mini),
                                   horizon=c.max_response_length)
                    # clipped surrogate with dual clip (verl's compute_policy_loss, vanilla mode)
                    neg_kl = (logp - old).clamp(-20.0, 20.0)
                    ratio = neg_kl.exp()
                    loss1 = -a * ratio
                    loss2 = -a * ratio.clamp(1.0 - c.clip_ratio_low, 1.0 + c.clip_ratio_high)
                    clipped = torch.maximum(loss1, loss2)
                    dual = torch.minimum(-a * c.clip_ratio_c, clipped)
                    pg = torch.where(a < 0, dual, clipped)
                    pg_loss = aggf(pg)
                    loss = pg_loss
                    if c.entropy_coeff:
                        loss = loss - c.entropy_coeff * aggf(ent)
                    if ref_logp is not None:
                        kl_loss = aggf(kl_penalty(logp, ref_logp[mb, :r], c.kl_loss_type))
                        loss = loss + c.kl_loss_coef * kl_loss
                        m["kl_loss"] += float(kl_loss.detach())
                    self.probe()
                    loss.backward()
                    with torch.no_grad():
                        m["pg_loss"] += float(pg_loss.detach())
                        m["pg_clipfrac"] += float(((loss2 > loss1).float() * mask).sum()) / tokens
                        m["ppo_kl"] += float((-neg_kl * mask).sum()) / tokens
                grad_norm = torch.nn.utils.clip_grad_norm_(params, c.clip_grad)
                if torch.isfinite(grad_norm):
                    self.opt.step()
                else:  # verl skips the update when the norm is not finite
                    self.opt.zero_grad(set_to_none=True)
                self.opt_step += 1
                for k, v in m.items():
                    sums[k] += v
                sums["grad_norm"] += float(grad_norm)
                n_mini += 1
        out = {f"actor/{k}": v / n_mini for k, v in sums.items()}
        if ref_logp is None:
            del out["actor/kl_loss"]
        out["actor/lr"] = lr
        return out

    # --- validation -----------------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        c = self.cfg
        self.actor.eval()
        prompts = [T.encode_prompt(d) for d in self.val_digits]
        gen = torch.Generator().manual_seed(self.val_sampler_seed) if c.val_do_sample else None
        responses = generate(self.actor, prompts, c.max_response_length, max_num_seqs=c.max_num_seqs,
                             temperature=c.val_temperature or 1.0, generator=gen)
        scores = [T.task_score(self.task, d, r) for d, r in zip(self.val_digits, responses)]
        name = self.task.name
        out = {
            f"val-core/{name}/reward/mean@1": sum(scores) / len(scores),
            f"val-aux/{name}/exact/mean@1": sum(s == 1.0 for s in scores) / len(scores),
            f"val-aux/{name}/response_length/mean": sum(len(r) for r in responses) / len(responses),
        }
        if name == "digit_sort_long":  # what the limit cuts (those score 0), and how many answers are whole
            out[f"val-aux/{name}/clip_ratio"] = sum(not r or r[-1] != T.EOS for r in responses) / len(responses)
            out[f"val-aux/{name}/complete/mean@1"] = sum(
                len(r) - 1 == len(d) for d, r in zip(self.val_digits, responses) if r and r[-1] == T.EOS) / len(responses)
        return out
