"""The learning is real: GRPO raises the held-out score on the tiny workload, learns when to stop, and a
clearly bad learning rate shows a pathology in the metrics (asserted on the metrics, not on a flag)."""

from __future__ import annotations

import torch

from mart.trial_runner.local.base_model import base_key, cache_dir, load_base_model
from mart.trial_runner.local.config import load_config
from mart.trial_runner.local.grpo import GRPOTrainer, Timer

CPU = torch.device("cpu")
VAL = "val-core/digit_sort/reward/mean@1"


def _train(overrides: dict, steps: int) -> tuple[list[float], list[dict]]:
    cfg = load_config(overrides)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trial processes run
    try:
        trainer = GRPOTrainer(cfg, load_base_model(cfg, CPU, log=lambda s: None), CPU, steps)
        vals = [trainer.validate()[VAL]]
        history = [trainer.step(Timer(CPU)) for _ in range(steps)]
        vals.append(trainer.validate()[VAL])
    finally:
        torch.set_num_threads(threads)
    return vals, history


def test_base_model_is_cached_on_disk(local_tiny_config):
    cfg = load_config(local_tiny_config)
    first = load_base_model(cfg, CPU, log=lambda s: None)
    path = cache_dir() / f"base-{base_key(cfg)}.pt"
    assert path.exists()
    again = load_base_model(cfg, CPU, log=lambda s: (_ for _ in ()).throw(AssertionError("retrained: " + s)))
    assert all(torch.equal(first[k], again[k]) for k in first)
    other = load_config({**local_tiny_config, "local.base_model.warmup_steps": 99})
    assert base_key(other) != base_key(cfg)


def test_grpo_raises_the_validation_score_and_learns_when_to_stop(local_tiny_config):
    vals, history = _train(local_tiny_config, 10)
    assert vals[1] - vals[0] >= 0.10, vals
    early = sum(h["critic/score/mean"] for h in history[:3]) / 3
    late = sum(h["critic/score/mean"] for h in history[-3:]) / 3
    assert late > early + 0.05, (early, late)
    # the base model rambles on after the answer; the policy learns to stop
    first_len = sum(h["response_length/mean"] for h in history[:3]) / 3
    last_len = sum(h["response_length/mean"] for h in history[-3:]) / 3
    assert last_len < first_len - 0.5, (first_len, last_len)


def test_a_100x_learning_rate_shows_a_pathology_in_the_metrics(local_tiny_config):
    good_lr = local_tiny_config["actor_rollout_ref.actor.optim.lr"]
    vals, history = _train({**local_tiny_config, "actor_rollout_ref.actor.optim.lr": 100 * good_lr}, 6)
    first, last = history[0], history[-3:]
    reward_collapse = max(h["critic/score/mean"] for h in last) < 0.5 * first["critic/score/mean"]
    entropy_collapse = min(h["actor/entropy"] for h in last) < 0.1 * first["actor/entropy"]
    grad_explosion = max(h["actor/grad_norm"] for h in history) > 100 * first["actor/grad_norm"]
    assert reward_collapse or entropy_collapse or grad_explosion, history
    assert reward_collapse, [h["critic/score/mean"] for h in history]
    assert vals[1] < vals[0] - 0.10, vals
