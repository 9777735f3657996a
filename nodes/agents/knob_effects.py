"""What each known knob does, as priors for the rules agents and the memory model.

``phase`` is the step phase the knob mainly speeds up; ``faster`` the direction that speeds it up
("up"/"down" for numbers, True/False for switches); ``memory_elasticity`` how peak memory scales with
a numeric knob (peak ∝ value ** e); ``memory_factor_on`` the memory factor of turning a switch on.
Sources: verl's perf-tuning guide (see docs/agents.md); unknown knobs get a neutral effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnobEffect:
    phase: str = "all"
    faster: Any = None
    memory_elasticity: float = 0.0
    memory_factor_on: float = 1.0
    note: str = ""


# Matched on the key's suffix, most specific first.
EFFECTS: dict[str, KnobEffect] = {
    "rollout.max_num_seqs": KnobEffect("gen", "up", 0.15, note="more sequences decoded concurrently"),
    "rollout.max_num_batched_tokens": KnobEffect("gen", "up", 0.1, note="larger prefill/decode batches"),
    "rollout.gpu_memory_utilization": KnobEffect("gen", "up", 0.6, note="more KV cache, more concurrency"),
    "rollout.tensor_model_parallel_size": KnobEffect("gen", "down", -0.2, note="less TP communication for small models"),
    "rollout.log_prob_micro_batch_size_per_gpu": KnobEffect("old_log_prob", "up", 0.2, note="fewer, larger forward passes"),
    "ref.log_prob_micro_batch_size_per_gpu": KnobEffect("ref", "up", 0.2, note="fewer, larger forward passes"),
    "actor.ppo_micro_batch_size_per_gpu": KnobEffect("update_actor", "up", 0.3, note="fewer, larger backward passes"),
    "actor.ppo_max_token_len_per_gpu": KnobEffect("update_actor", "up", 0.3, note="larger token-balanced micro batches"),
    "actor.use_dynamic_bsz": KnobEffect("update_actor", True, 0.0, 1.05, note="packs micro batches by tokens"),
    "model.enable_gradient_checkpointing": KnobEffect("update_actor", False, 0.0, 0.7, note="recompute saves activations"),
    "actor.fsdp_config.param_offload": KnobEffect("update_actor", False, 0.0, 0.8, note="offload saves GPU memory"),
    "actor.fsdp_config.optimizer_offload": KnobEffect("update_actor", False, 0.0, 0.75, note="offload saves GPU memory"),
    "ref.fsdp_config.param_offload": KnobEffect("ref", False, 0.0, 0.9, note="offload saves GPU memory"),
    "rollout.enforce_eager": KnobEffect("gen", False, 0.0, 0.97, note="CUDA graphs speed up decode"),
    "rollout.enable_chunked_prefill": KnobEffect("gen", True, 0.0, 1.0),
    "model.use_remove_padding": KnobEffect("update_actor", True, 0.0, 0.9, note="no compute on padding"),
    # learning knobs (the memory model ignores them, except the number of rollouts)
    "rollout.n": KnobEffect("all", "down", 0.3),
    # multi-agent workflows (MARTI): every debate round is one more generation pass per agent, its prompt
    # carrying the other agents' previous answers
    "workflow.num_rounds": KnobEffect("gen", "down", 0.3, note="each round is one more generation pass per agent"),
    "rollout.async_num_tasks": KnobEffect("gen", "up", 0.0, note="concurrent workflow tasks overlap the stages' "
                                          "barriers; too few starve the engines"),
}


def effect_of(key: str) -> KnobEffect:
    """The effect of a knob, matched on its suffix: a per-agent knob (``agents.<i>.actor.ppo_micro_batch_size_per_gpu``)
    has the effect of the same knob in a single-agent job, on that agent's share of the step."""
    for suffix, eff in EFFECTS.items():
        if key.endswith(suffix):
            return eff
    return KnobEffect()
