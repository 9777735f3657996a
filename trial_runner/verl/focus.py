"""The focused verl search space: the knobs that matter, over ranges a practitioner would try.

The full catalogue (``space.SEARCH_SPACE``) lets a tuner set micro batches to 256, token caps to 262144 or
offload parameters; most of that space is invalid or out of memory, and a blind search spends its budget
there. ``FOCUS`` is the one definition of the narrowed space: the knobs verl's performance-tuning guide
(https://verl.readthedocs.io/en/latest/perf/perf_tuning.html) and the GRPO recipes move, each over a sane
range. mart's agents and the benchmark's "restricted" baselines both search it (``focus_space``), so the
comparison between them is over the same space.
"""

from __future__ import annotations

import dataclasses

from mart.state.search_space import SearchSpace
from mart.state.verl_keys import ARR

#: key -> (low, high) for numeric knobs, or None to keep a switch's two values. Order = the perf guide's.
FOCUS: dict[str, tuple[float, float] | None] = {
    # stage 1 (system)
    f"{ARR}.rollout.gpu_memory_utilization": (0.3, 0.9),
    f"{ARR}.rollout.tensor_model_parallel_size": None,
    f"{ARR}.rollout.max_num_seqs": (64, 1024),
    f"{ARR}.rollout.max_num_batched_tokens": (2048, 32768),
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu": (4, 128),
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu": (1, 64),
    f"{ARR}.actor.use_dynamic_bsz": None,
    f"{ARR}.actor.ppo_max_token_len_per_gpu": (4096, 65536),
    f"{ARR}.model.enable_gradient_checkpointing": None,
    f"{ARR}.actor.strategy": None,
    # stage 2 (learning)
    f"{ARR}.actor.optim.lr": (1e-7, 1e-5),
    f"{ARR}.actor.use_kl_loss": None,
    f"{ARR}.actor.kl_loss_coef": (1e-4, 0.1),
    f"{ARR}.actor.entropy_coeff": (0.0, 0.005),
    f"{ARR}.actor.clip_ratio_high": (0.2, 0.32),
    f"{ARR}.rollout.temperature": (0.6, 1.2),
    f"{ARR}.actor.ppo_mini_batch_size": (16, 512),
}


def focus_space(space: SearchSpace) -> SearchSpace:
    """``space`` narrowed to the ``FOCUS`` knobs it has (ranges clipped to both), same constraints.

    A knob whose default lies outside the narrowed range keeps the default as a bound, so the baseline
    config stays expressible.
    """
    params = []
    for key, rng in FOCUS.items():
        if key not in space:
            continue
        params.append(narrowed(space[key], rng))
    return SearchSpace(backend=f"{space.backend}-focus", params=params, constraints=list(space.constraints))


def narrowed(p, rng: tuple[float, float] | None):
    """``p`` with its range clipped to ``rng`` (None: unchanged), widened again to keep its default."""
    if rng is None or p.low is None or p.high is None:
        return p
    lo, hi = max(float(p.low), rng[0]), min(float(p.high), rng[1])
    if isinstance(p.default, (int, float)) and not isinstance(p.default, bool):
        lo, hi = min(lo, p.default), max(hi, p.default)
    if p.kind == "int":
        lo, hi = int(lo), int(hi)
    return dataclasses.replace(p, low=lo, high=hi)


__all__ = ["FOCUS", "focus_space"]
