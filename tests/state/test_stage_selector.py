"""The schedule stage's knobs (issue 24): the learning knobs plus the system knobs a capacity change implies
(``ParamSpec.schedule``), one selector for listing, validating and describing them."""

from __future__ import annotations

import pytest

from mart.state.search_space import ConfigError
from mart.trial_runner.local.space import SEARCH_SPACE as LOCAL
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL

A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
CAPS = {A + "ppo_max_token_len_per_gpu", R + "max_num_batched_tokens"}
MICRO = {A + "ppo_micro_batch_size_per_gpu", R + "log_prob_micro_batch_size_per_gpu",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"}  # ParamSpec.memory_safe


def test_the_schedule_stage_moves_learning_knobs_and_the_implied_token_caps():
    learning = {p.key for p in VERL.stage_params("learning")}
    schedule = {p.key for p in VERL.stage_params("schedule")}
    assert schedule == learning | CAPS | MICRO and "data.max_response_length" in learning
    assert {p.key for p in LOCAL.stage_params("schedule")} - {p.key for p in LOCAL.stage_params("learning")} == {
        A + "ppo_max_token_len_per_gpu"}
    assert VERL.validate_overrides({A + "ppo_max_token_len_per_gpu": 32768}, stage="schedule")
    assert VERL.validate_overrides({A + "ppo_micro_batch_size_per_gpu": 8}, stage="schedule")
    with pytest.raises(ConfigError, match="system-stage knob; it cannot change in the schedule stage"):
        VERL.validate_overrides({R + "gpu_memory_utilization": 0.5}, stage="schedule")
    with pytest.raises(ConfigError, match="cannot change in the learning stage"):  # stage 2 is as it was
        VERL.validate_overrides({A + "ppo_max_token_len_per_gpu": 32768}, stage="learning")
    text = VERL.describe("schedule")
    assert f"- {A}ppo_max_token_len_per_gpu " in text and f"- {A}optim.lr " in text
    assert f"- {A}ppo_max_token_len_per_gpu " not in VERL.describe("learning")
    assert set(VERL.defaults("schedule")) == schedule
