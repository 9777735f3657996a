"""A reviewer names a knob by its key, a unique dotted suffix or its short name; anything else is refused
with the closest names."""

from __future__ import annotations

import pytest

from mart.state.search_space import ConfigError
from mart.trial_runner.verl.space import SEARCH_SPACE as S


@pytest.mark.parametrize("name, key", [
    ("actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("gpu_memory_utilization", "actor_rollout_ref.rollout.gpu_memory_utilization"),
    ("micro_batch", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("lr", "actor_rollout_ref.actor.optim.lr"),
    ("+ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
])
def test_names_resolve(name, key):
    assert S.resolve_key(name) == key


def test_ambiguous_and_unknown_names_are_refused_with_candidates():
    with pytest.raises(ConfigError, match="ambiguous.*rollout.log_prob.*ref.log_prob|ambiguous.*ref.log_prob.*rollout"):
        S.resolve_key("log_prob_micro_batch_size_per_gpu")
    with pytest.raises(ConfigError, match="not a tunable knob.*Closest: `max_num_seqs`"):
        S.resolve_key("max_num_seq")
    with pytest.raises(ConfigError) as e:
        S.resolve_keys({"bogus": 1, "micro_batchh": 2})
    assert "`bogus`" in str(e.value) and "`micro_batchh`" in str(e.value) and "`micro_batch`" in str(e.value)


def test_every_knob_has_an_edit_name_that_resolves_to_it():
    for p in S.params:
        assert S.resolve_key(S.edit_name(p.key)) == p.key
