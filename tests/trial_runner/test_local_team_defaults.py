"""A multi-agent local job's default workload: a team step generates about as many answers as a single-agent step."""

from __future__ import annotations

import json

import pytest

from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.config import DEFAULTS

BATCH, MINI, N = "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.rollout.n"


@pytest.mark.parametrize("workflow,agents,batch", [("debate", 2, 8), ("debate", 3, 4), ("chain", 2, 16), ("chain", 3, 8)])
def test_team_batch_keeps_a_step_within_twice_a_single_agent_step(workflow, agents, batch):
    b = LocalBackend(workflow=workflow, agents=agents)
    cfg = b.base_config()
    assert cfg[BATCH] == batch and cfg[BATCH] % cfg[MINI] == 0 and b.validate_config(cfg) == []
    answers = agents * (cfg["workflow.num_rounds"] if workflow == "debate" else 1)
    single = DEFAULTS[BATCH] * DEFAULTS[N]
    # between one and two single-agent steps' answers
    assert single <= cfg[BATCH] * cfg[N] * answers <= 2 * single


def test_single_agent_defaults_are_unchanged():
    cfg = LocalBackend().base_config()
    assert cfg[BATCH] == DEFAULTS[BATCH] == 16 and cfg[MINI] == DEFAULTS[MINI]


def test_a_base_config_files_batch_sizes_win(tmp_path):
    f = tmp_path / "base.json"
    f.write_text(json.dumps({BATCH: 12, MINI: 4}))
    cfg = LocalBackend(workflow="debate", base_config=str(f)).base_config()
    assert (cfg[BATCH], cfg[MINI]) == (12, 4)
    f.write_text(json.dumps({MINI: 6}))  # only the mini batch: the batch rounds up to whole mini batches
    b = LocalBackend(workflow="debate", base_config=str(f))
    assert (b.base_config()[BATCH], b.base_config()[MINI]) == (12, 6) and b.validate_config(b.base_config()) == []
