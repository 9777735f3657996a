"""Reviewer feedback read phrase by phrase: negation scope, "keep X", "anything but Y", two knobs, short names."""

from __future__ import annotations

import pytest

from mart.nodes.agents.feedback import parse_feedback
from mart.trial_runner.verl.space import SEARCH_SPACE

S = SEARCH_SPACE


@pytest.mark.parametrize("text, read", [
    # "keep" governs "it simple", not the knobs after the colon
    ("keep it simple: try enforce_eager or chunked prefill", ["try chunked_prefill", "try enforce_eager"]),
    # one negation covers both knobs of "X or Y"; the next phrase has its own verb
    ("don't touch max_num_seqs or the micro batch; raise the memory share",
     ["raise gpu_memory_utilization", "leave micro_batch alone", "leave max_num_seqs alone"]),
    ("anything but gradient checkpointing", ["leave gradient_checkpointing alone"]),
    ("keep max_num_seqs, increase micro_batch and lower rollout.gpu_memory_utilization",
     ["raise micro_batch", "lower gpu_memory_utilization", "leave max_num_seqs alone"]),
    # a negated verb forbids that direction only
    ("don't increase lr", ["don't raise lr"]),
    # the intent may follow the knob
    ("micro batch higher please", ["raise micro_batch"]),
    ("no param offload, it is too slow", ["leave actor.fsdp_config.param_offload alone"]),
    ("too risky, use less memory", ["prefer configs that use less memory"]),
    ("reviewer on sys-02: leave tensor_model_parallel alone but double max_num_seqs",
     ["raise max_num_seqs", "leave tensor_model_parallel alone"]),
    ("try TP 1", ["try tensor_model_parallel"]),
    ("enable dynamic bsz", ["turn on dynamic_bsz"]),
    ("turn off gradient checkpointing", ["turn off gradient_checkpointing"]),
    # a name inside a longer one belongs to the longer one
    ("increase the log prob micro batch", ["raise rollout.log_prob_micro_batch_size_per_gpu"]),
    # the critic's reasons quote knob names but are no reviewer's intent
    ("critic: max_num_seqs over the memory limit", []),
])
def test_phrasings(text, read):
    assert parse_feedback([text], S).describe(S) == read


def test_rules_follow_the_reading():
    r = parse_feedback(["don't increase lr; keep max_num_seqs; raise micro_batch"], S)
    lr, seqs, mb = "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.max_num_seqs", \
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    assert not r.allows(lr, "up") and r.allows(lr, "down")
    assert not r.allows(seqs, "up") and not r.allows(seqs, "down")
    assert r.allows(mb, "up") and not r.allows(mb, "down") and mb in r.focus
