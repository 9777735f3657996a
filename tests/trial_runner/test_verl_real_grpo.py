"""The local CPU trainer computes what verl 0.9.1 computes, on the same inputs: the GRPO outcome advantage
(``core_algos.compute_grpo_outcome_advantage``), the step's data metrics (``metric_utils.compute_data_metrics``)
and an outcome reward of the gsm8k scorer's shape (``reward_score.gsm8k``). Needs the verl extra; skipped
otherwise."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl extra not installed: pip install .[verl]")

from mart.trial_runner.local import grpo
from mart.trial_runner.local import task as T
from mart.trial_runner.local.config import TINY_CONFIG, load_config
from mart.trial_runner.local.grpo import GRPOTrainer, Timer, grpo_advantages, model_config
from mart.trial_runner.local.model import GPT

pytestmark = [pytest.mark.verl, pytest.mark.timeout(300)]


def verl_advantages(scores: torch.Tensor, lengths: list[int], n: int, norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO on a batch laid out as verl lays it out: the sequence score on its last response token
    (the reward manager's placement), ``rollout.n`` samples of a prompt next to each other under one uid."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    width = max(lengths)
    mask = torch.zeros(len(lengths), width)
    rewards = torch.zeros(len(lengths), width)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1.0
        rewards[i, length - 1] = scores[i]
    uids = np.array([f"uid-{i // n}" for i in range(len(lengths))], dtype=object)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
    return adv, mask


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("n", [2, 5, 8])
def test_grpo_advantage_is_verls(n, norm):
    rng = random.Random(n)
    groups = []
    for g in range(12):
        if g % 4 == 0:
            groups.append([0.5] * n)  # all equal: zero advantage, not a division by zero
        elif g % 4 == 1:
            groups.append([float(rng.random() < 0.5) for _ in range(n)])  # binary outcome rewards
        else:
            groups.append([rng.choice([0.0, 0.25, 1.0, rng.random()]) for _ in range(n)])
    scores = torch.tensor([s for grp in groups for s in grp])
    lengths = [rng.randint(1, 16) for _ in scores]
    want, mask = verl_advantages(scores, lengths, n, norm)
    got = grpo_advantages(scores, n, norm).unsqueeze(-1) * mask
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def _one_local_step(monkeypatch, overrides: dict):
    """One real GRPOTrainer step (random base weights: many responses ramble to the length cap), with the
    prompts, responses, rewards and advantages it used recorded on the way."""
    seen: dict = {"pairs": []}
    real_score, real_adv = T.score, grpo.grpo_advantages

    def score(digits, response):
        seen["pairs"].append((list(digits), list(response)))
        return real_score(digits, response)

    def advantages(scores, n, norm_by_std, eps=1e-6):
        seen["scores"], seen["adv"] = scores.clone(), real_adv(scores, n, norm_by_std, eps)
        return seen["adv"]

    monkeypatch.setattr(T, "score", score)
    monkeypatch.setattr(grpo, "grpo_advantages", advantages)
    cfg = load_config({**TINY_CONFIG, **overrides})
    torch.manual_seed(0)
    trainer = GRPOTrainer(cfg, GPT(model_config(cfg)).state_dict(), torch.device("cpu"), total_steps=1)
    metrics = trainer.step(Timer(torch.device("cpu")))
    return cfg, seen, metrics


@pytest.mark.parametrize("norm", [True, False])
def test_a_local_step_reports_what_verl_computes_from_its_batch(monkeypatch, norm):
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import compute_data_metrics

    cfg, seen, metrics = _one_local_step(monkeypatch, {"algorithm.norm_adv_by_std_in_grpo": norm})
    prompts = [T.encode_prompt(d) for d, _ in seen["pairs"]]
    responses = [r for _, r in seen["pairs"]]
    lengths = [len(r) for r in responses]
    assert max(lengths) == cfg.max_response_length  # some responses hit the cap: clip_ratio is exercised
    adv, mask = verl_advantages(seen["scores"], lengths, cfg.rollout_n, norm)
    torch.testing.assert_close(seen["adv"].unsqueeze(-1) * mask, adv, rtol=0, atol=1e-6)

    # the batch as verl holds it: prompts left-padded to max_prompt_length, responses right-padded to
    # max_response_length (vLLM's fixed width), the score on the last response token
    B, P, R = len(prompts), cfg.max_prompt_length, cfg.max_response_length
    pad = lambda rows, width, left: torch.tensor([([T.PAD] * (width - len(x)) + x) if left else
                                                 (x + [T.PAD] * (width - len(x))) for x in rows])
    full_mask = torch.zeros(B, R)
    full_mask[:, : mask.shape[1]] = mask
    scores = torch.zeros(B, R)
    for i, length in enumerate(lengths):
        scores[i, length - 1] = seen["scores"][i]
    full_adv = torch.zeros(B, R)
    full_adv[:, : adv.shape[1]] = adv
    batch = DataProto.from_dict(tensors={
        "prompts": pad(prompts, P, True), "responses": pad(responses, R, False), "response_mask": full_mask,
        "attention_mask": torch.cat([torch.tensor([[0.0] * (P - len(p)) + [1.0] * len(p) for p in prompts]),
                                     full_mask], dim=1),
        "token_level_scores": scores, "token_level_rewards": scores, "advantages": full_adv, "returns": full_adv,
    })
    want = compute_data_metrics(batch, use_critic=False)
    for key in ("critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean",
                "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
                "response_length/mean", "response_length/max", "response_length/min", "response_length/clip_ratio",
                "prompt_length/mean", "prompt_length/max", "prompt_length/min"):
        assert metrics[key] == pytest.approx(want[key], abs=1e-6), (key, metrics[key], want[key])


def _gsm8k_text(response: list[int]) -> str:
    """A local response written the way a gsm8k answer ends: ``#### `` then its tokens (digits as digits; the
    special tokens as text a number cannot contain; what follows <eos> is never generated)."""
    names = {T.PAD: " <pad>", T.BOS: " <bos>", T.SEP: " <sep>"}
    body = "".join(names.get(t, str(t)) for t in response if t != T.EOS)
    return f"#### {body}"


def test_the_local_reward_is_full_exactly_when_verls_gsm8k_scorer_says_correct():
    """The local verifier gives partial credit below 1.0; its 1.0 (the validation's ``exact``) is verl's strict
    gsm8k verdict on the same answer: correct digits, stopped, nothing else."""
    from verl.utils.reward_score import gsm8k

    rng = random.Random(0)
    cases = []
    for _ in range(400):
        digits = [rng.randrange(10) for _ in range(rng.randint(3, 10))]
        answer = T.answer_tokens(digits)
        kind = rng.randrange(6)
        if kind == 0:
            resp = answer  # correct and stopped
        elif kind == 1:
            resp = answer[:-1] + [answer[-2]] * rng.randint(1, 4) + [T.EOS]  # rambles on, then stops
        elif kind == 2:
            resp = answer[: rng.randint(0, len(answer) - 2)] + [T.EOS]  # stops early
        elif kind == 3:
            resp = list(answer)
            resp[rng.randrange(len(resp) - 1)] = rng.choice([x for x in range(T.VOCAB_SIZE) if x != T.EOS])
        elif kind == 4:
            resp = answer[:-1]  # the length cap cut it exactly after the digits
        else:
            resp = [rng.randrange(T.VOCAB_SIZE) for _ in range(rng.randint(1, 12))]
            if T.EOS in resp:
                resp = resp[: resp.index(T.EOS) + 1]
        cases.append((digits, resp))
    verdicts = set()
    for digits, resp in cases:
        truth = "".join(map(str, T.target(digits)))
        verl_correct = gsm8k.compute_score(_gsm8k_text(resp), truth) == 1.0
        assert (T.score(digits, resp) == 1.0) == verl_correct, (digits, resp, T.score(digits, resp))
        verdicts.add(verl_correct)
    assert verdicts == {True, False}
