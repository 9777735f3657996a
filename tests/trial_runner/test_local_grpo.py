"""The GRPO step's pieces, in-process: task, sampling, batching, losses, and the invariance of the maths
under the system knobs (they may change speed and memory, never the update)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from mart.trial_runner.local import task as T
from mart.trial_runner.local.config import load_config
from mart.trial_runner.local.grpo import (
    GRPOTrainer,
    Timer,
    agg,
    get_lr,
    grpo_advantages,
    kl_penalty,
    micro_batches,
    model_config,
)
from mart.trial_runner.local.model import GPT
from mart.trial_runner.local.rollout import generate, logprobs_entropy, pack, response_logits
from tests.conftest import LOCAL_TINY_CONFIG

CPU = torch.device("cpu")


def test_validation_split_is_held_out_and_fixed():
    cfg = T.TaskConfig()
    val = T.val_set(cfg)
    assert val == T.val_set(cfg) and len(val) == cfg.val_size
    assert all(T.is_val(d) for d in val)
    rng = random.Random(0)
    train = [T.sample_digits(rng, cfg, "train") for _ in range(2000)]
    assert not any(T.is_val(d) for d in train)
    assert {len(d) for d in train} == set(range(cfg.min_digits, cfg.max_digits + 1))


def test_verifier_gives_partial_credit_and_punishes_not_stopping():
    d = [3, 1, 2]
    assert T.score(d, [1, 2, 3, T.EOS]) == 1.0
    assert T.score(d, [1, 2, T.EOS]) == pytest.approx(2 / 3)  # stopped early
    assert T.score(d, [1, 2, 3, 3, 3, T.EOS]) == pytest.approx(3 / 5)  # rambled on
    assert T.score(d, [1, 2, 3, 3, 3, 3]) == pytest.approx(3 / 6)  # never stopped
    assert T.score(d, [1, 9, 3, T.EOS]) == pytest.approx(2 / 3)
    assert T.score(d, [T.EOS]) == 0.0


def test_demonstrations_ramble_at_the_configured_rate():
    rng = random.Random(0)
    demos = [T.demonstration([5, 2, 7], rng, 0.6, 3) for _ in range(2000)]
    rambling = [x for x in demos if len(x) > 4]
    assert 0.55 < len(rambling) / len(demos) < 0.65
    assert all(x[:3] == [2, 5, 7] and x[-1] == T.EOS and set(x[3:-1]) <= {7} for x in demos)


def _tiny_model(seed: int = 0, **over) -> tuple[GPT, object]:
    cfg = load_config({**LOCAL_TINY_CONFIG, **over})
    torch.manual_seed(seed)
    return GPT(model_config(cfg)).eval(), cfg


def test_sampling_does_not_depend_on_chunking_and_greedy_is_deterministic():
    model, _ = _tiny_model()
    rng = random.Random(1)
    prompts = [T.encode_prompt(T.sample_digits(rng, T.TaskConfig(max_digits=6), "train")) for _ in range(20)]
    outs = [generate(model, prompts, 12, max_num_seqs=k, generator=torch.Generator().manual_seed(7)) for k in (3, 20)]
    assert outs[0] == outs[1]
    assert len({len(r) for r in outs[0]}) > 1  # lengths vary per prompt
    other = generate(model, prompts, 12, max_num_seqs=20, generator=torch.Generator().manual_seed(8))
    assert other != outs[0]
    assert generate(model, prompts, 12, max_num_seqs=4) == generate(model, prompts, 12, max_num_seqs=16)


def test_cached_generation_matches_the_full_forward():
    model, _ = _tiny_model()
    prompts = [T.encode_prompt(d) for d in ([1, 2, 3], [9, 8, 7, 6, 5], [4, 4, 4, 4])]
    responses = generate(model, prompts, 10, max_num_seqs=3, temperature=1.0,
                         generator=torch.Generator().manual_seed(3))
    # greedy continuation recomputed with full forwards (no cache, no padding), token by token
    greedy = generate(model, prompts, 10, max_num_seqs=3)
    for p, r in zip(prompts, greedy):
        seq, out = list(p), []
        for _ in range(len(r)):
            idx = torch.tensor([seq])
            logits = model(idx, torch.arange(len(seq))[None], torch.ones(1, 1, len(seq), len(seq), dtype=torch.bool).tril())
            logits[0, -1, T.PAD] = -math.inf
            out.append(int(logits[0, -1].argmax()))
            seq.append(out[-1])
        assert out == r
    # padding to verl's fixed lengths changes nothing
    a = pack(prompts, responses, CPU)
    b = pack(prompts, responses, CPU, pad_prompt_to=8, pad_response_to=12)
    lp_a, _ = logprobs_entropy(response_logits(model, a), a.resp_ids)
    lp_b, _ = logprobs_entropy(response_logits(model, b), b.resp_ids)
    r = a.R
    assert torch.allclose(lp_a * a.resp_mask, lp_b[:, :r] * a.resp_mask, atol=1e-5)


def test_token_micro_batches_respect_the_cap_and_cover_everything():
    lengths = [random.Random(i).randint(3, 30) for i in range(50)]
    mbs = micro_batches(lengths, list(range(50)), None, 64)
    assert sorted(i for mb in mbs for i in mb) == list(range(50))
    assert all(sum(lengths[i] for i in mb) <= 64 for mb in mbs)
    assert micro_batches(lengths, list(range(10)), 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_lr_schedule():
    cfg = load_config({"actor_rollout_ref.actor.optim.lr_warmup_steps": 4,
                       "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
                       "actor_rollout_ref.actor.optim.min_lr_ratio": 0.1})
    lrs = [get_lr(i, 24, cfg) for i in range(24)]
    assert lrs[0] == pytest.approx(cfg.lr / 4) and lrs[3] == pytest.approx(cfg.lr)
    assert lrs[3:] == sorted(lrs[3:], reverse=True)
    assert get_lr(24, 24, cfg) == pytest.approx(0.1 * cfg.lr)
    const = load_config({"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.5})
    assert get_lr(0, 10, const) == pytest.approx(const.lr / 5) and get_lr(7, 10, const) == const.lr


def test_grpo_advantages_are_group_normalised():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2])
    adv = grpo_advantages(scores, 4, True).view(2, 4)
    assert torch.allclose(adv.mean(-1), torch.zeros(2), atol=1e-6)
    assert adv[0].std() == pytest.approx(1.0, abs=1e-4) and torch.all(adv[1] == 0)
    plain = grpo_advantages(scores, 4, False).view(2, 4)
    assert torch.allclose(plain[0], torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_kl_estimators():
    logp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    assert torch.all(kl_penalty(logp, logp, "low_var_kl") == 0) and torch.all(kl_penalty(logp, logp, "kl") == 0)
    ref = torch.log(torch.tensor([0.3, 0.3, 0.3]))
    assert torch.all(kl_penalty(logp, ref, "low_var_kl") > 0) and torch.all(kl_penalty(logp, ref, "mse") > 0)
    assert torch.allclose(kl_penalty(logp, ref, "kl"), logp - ref)


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_micro_batch_shares_add_up_to_the_mini_batch_loss(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1
    tokens = float(mask.sum())
    whole = agg(loss, mask, mode, tokens, 6, 5)
    parts = agg(loss[:2], mask[:2], mode, tokens, 6, 5) + agg(loss[2:], mask[2:], mode, tokens, 6, 5)
    assert parts == pytest.approx(float(whole), rel=1e-5)


def _one_step(**over) -> tuple[dict, list[torch.Tensor]]:
    cfg = load_config({**LOCAL_TINY_CONFIG, "actor_rollout_ref.actor.optim.lr": 1e-3, **over})
    torch.manual_seed(123)
    base = GPT(model_config(cfg)).state_dict()
    trainer = GRPOTrainer(cfg, base, CPU, total_steps=3)
    metrics = trainer.step(Timer(CPU))
    return metrics, [p.detach().clone() for p in trainer.actor.parameters()]


def test_system_knobs_change_speed_not_the_update():
    ref_metrics, ref_params = _one_step()
    variants = [
        {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 3,
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 5,
         "actor_rollout_ref.rollout.max_num_seqs": 7},
        {"actor_rollout_ref.actor.use_dynamic_bsz": True, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 100},
        {"actor_rollout_ref.model.enable_gradient_checkpointing": True},
        {"actor_rollout_ref.model.use_remove_padding": False},
    ]
    for over in variants:
        metrics, params = _one_step(**over)
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
                    "actor/pg_clipfrac", "perf/total_num_tokens"):
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-4, abs=1e-6), (over, key)
        assert metrics["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"], rel=1e-3)
        for a, b in zip(params, ref_params):
            assert torch.allclose(a, b, atol=1e-5), over


def test_learning_knobs_do_change_the_update():
    _, ref_params = _one_step()
    _, params = _one_step(**{"actor_rollout_ref.actor.clip_ratio_high": 0.01, "actor_rollout_ref.actor.ppo_epochs": 2})
    assert any(not torch.allclose(a, b, atol=1e-5) for a, b in zip(params, ref_params))


def test_step_metrics_are_complete_and_sane():
    metrics, _ = _one_step(**{"actor_rollout_ref.actor.entropy_coeff": 0.01})
    for key in ("actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_loss", "actor/kl_loss",
                "actor/grad_norm", "actor/lr", "critic/score/mean", "critic/score/max", "critic/score/min",
                "response_length/mean", "response_length/max", "response_length/min", "response_length/clip_ratio",
                "perf/total_num_tokens"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert 0 <= metrics["critic/score/min"] <= metrics["critic/score/mean"] <= metrics["critic/score/max"] <= 1
    assert 1 <= metrics["response_length/min"] <= metrics["response_length/mean"] <= metrics["response_length/max"] <= 12
    assert 0 <= metrics["response_length/clip_ratio"] <= 1
    no_kl, _ = _one_step(**{"actor_rollout_ref.actor.use_kl_loss": False})
    assert "actor/kl_loss" not in no_kl
