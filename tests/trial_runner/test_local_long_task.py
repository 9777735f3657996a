"""The long task (``local.task.name=digit_sort_long``, issue 24): answers need more tokens as the policy learns to
finish them, a response cut at ``data.max_response_length`` scores 0, and the limit is a learning knob there (the
capacity a staged schedule raises); the default task and its catalogue are unchanged."""

from __future__ import annotations

import random

import pytest
import torch

from mart.trial_runner.local import task as T
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.base_model import load_base_model
from mart.trial_runner.local.config import load_config
from mart.trial_runner.local.grpo import GRPOTrainer
from mart.trial_runner.local.rollout import generate
from tests.conftest import LOCAL_TINY_CONFIG

LONG = T.TaskConfig(name="digit_sort_long")
LIMIT = "data.max_response_length"


def test_a_cut_answer_scores_nothing_in_the_long_task_only() -> None:
    d = [3, 1, 2]
    assert T.task_score(LONG, d, [1, 2, 3, T.EOS]) == 1.0
    assert T.task_score(LONG, d, [1, 2, T.EOS]) == pytest.approx(2 / 3)  # finished too early: partial credit
    assert T.task_score(LONG, d, [1, 2, 3]) == 0.0  # cut at the limit before its <eos>: unfinished
    assert T.task_score(T.TaskConfig(), d, [1, 2, 3]) == T.score(d, [1, 2, 3]) == 1.0  # the default task as before


def test_the_long_tasks_base_model_habit_is_stopping_too_early() -> None:
    rng = random.Random(0)
    digits = [5, 2, 7, 1, 9]
    demos = [T.task_demonstration(LONG, digits, rng, 0.0, 0) for _ in range(4000)]
    short = [x for x in demos if len(x) - 1 < len(digits)]
    assert abs(len(short) / len(demos) - T.SHORT_PROB) < 0.03
    assert all(x[-1] == T.EOS and 2 <= len(x) - 1 <= 4 and x[:-1] == sorted(digits)[: len(x) - 1] for x in short)
    assert all(x[:-1] == sorted(digits) for x in demos if x not in short)  # the others are whole (no ramble asked)


def test_the_long_task_makes_the_response_limit_a_learning_knob() -> None:
    default, long = LocalBackend().search_space(), LocalBackend(task="digit_sort_long").search_space()
    assert LIMIT not in default and long[LIMIT].stage == "learning"
    assert {p.key for p in long.params} - {p.key for p in default.params} == {LIMIT}
    assert LocalBackend(task="digit_sort_long").base_config()["local.task.name"] == "digit_sort_long"
    with pytest.raises(ValueError, match="backend option `task`"):
        LocalBackend(task="sudoku")


def test_validation_scores_cut_answers_zero_and_reports_what_the_limit_cut() -> None:
    """Greedy validation under a limit shorter than most answers: the score is the long task's rule applied to the
    very responses the trainer generates (recomputed here), and the clip ratio is the share cut."""
    cfg = load_config({**LOCAL_TINY_CONFIG, "local.task.name": "digit_sort_long", LIMIT: 4})
    cpu = torch.device("cpu")
    trainer = GRPOTrainer(cfg, load_base_model(cfg, cpu, log=lambda s: None), cpu, total_steps=1)
    out = trainer.validate()
    responses = generate(trainer.actor, [T.encode_prompt(d) for d in trainer.val_digits], 4,
                         max_num_seqs=cfg.max_num_seqs, temperature=1.0, generator=None)
    scores = [T.task_score(trainer.task, d, r) for d, r in zip(trainer.val_digits, responses)]
    cut = sum(r[-1] != T.EOS for r in responses) / len(responses)
    assert out["val-core/digit_sort_long/reward/mean@1"] == pytest.approx(sum(scores) / len(scores))
    assert out["val-aux/digit_sort_long/clip_ratio"] == pytest.approx(cut) and cut > 0.3
    assert out["val-core/digit_sort_long/reward/mean@1"] < sum(T.score(d, r) for d, r in zip(trainer.val_digits, responses)) / len(responses)
