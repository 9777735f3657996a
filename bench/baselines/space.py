"""Sampling a search-space stage the way each baseline does: uniformly at random, on a grid, with Optuna."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from mart.state.search_space import ParamSpec, SearchSpace

#: int ranges spanning this factor or more are sampled log-uniformly (batch sizes, sequence caps)
LOG_INT_RATIO = 16


def _log_int(p: ParamSpec) -> bool:
    return p.kind == "int" and p.low is not None and p.low > 0 and p.high / p.low >= LOG_INT_RATIO


def sample_param(p: ParamSpec, rng: random.Random) -> Any:
    if p.kind == "bool":
        return rng.random() < 0.5
    if p.kind == "categorical":
        return rng.choice(list(p.choices))
    lo, hi = float(p.low), float(p.high)
    if p.kind == "log":
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if p.kind == "float":
        return rng.uniform(lo, hi)
    if _log_int(p):
        return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    return rng.randint(int(lo), int(hi))


def focused(space: SearchSpace) -> SearchSpace:
    """The focused space the restricted baselines search: verl's ``FOCUS`` (``mart.trial_runner.verl.focus``);
    on a multi-agent catalogue the same knobs per agent plus the workflow/shaping/async knobs
    (``mart.trial_runner.sim.multi_agent.focus_space``)."""
    if any(p.key.startswith("agents.") for p in space.params):
        from mart.trial_runner.sim.multi_agent import focus_space as ma_focus

        return ma_focus(space)
    from mart.trial_runner.verl.focus import focus_space

    return focus_space(space)


def valid(space: SearchSpace, base: dict[str, Any], overrides: dict[str, Any]) -> bool:
    return not space.check_constraints({**base, **overrides})


#: draws (each repaired) a method may spend on one proposal before it reports "no valid candidate";
#: the same for every method (random, TPE, CMA-ES), and no trial budget is spent on them
REDRAWS = 200

_A, _R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."


def _get(cfg: dict[str, Any], key: str, default: Any) -> Any:
    v = cfg.get(key, default)
    return default if v is None else v


def _largest_divisor_le(n: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


def repair(space: SearchSpace, base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Project a drawn config onto verl's constraints by moving only the knobs the draw set.

    Uniform draws of the coupled batch knobs almost never satisfy verl's divisibility rules (0.59% of
    learning configs with a static micro batch of 16), so every method's draws go through this same
    projection: TP to a divisor of the GPU count, micro batches to a divisor of the per-GPU mini batch,
    the mini batch to a multiple of the data-parallel unit and <= the train batch, token caps up to the
    sequence length. What it cannot fix is redrawn (``REDRAWS``).
    """
    over = dict(overrides)
    cfg = {**base, **over}
    n_gpus = int(_get(cfg, "trainer.n_gpus_per_node", 8)) * int(_get(cfg, "trainer.nnodes", 1))
    per_node = int(_get(cfg, "trainer.n_gpus_per_node", 8))
    seq = int(_get(cfg, "data.max_prompt_length", 512)) + int(_get(cfg, "data.max_response_length", 512))

    def fit(key: str, value: Any) -> None:
        if key in space:
            p = space[key]
            if p.low is not None and p.high is not None:
                value = min(max(value, p.low), p.high)
                value = int(value) if p.kind == "int" else value
            over[key] = value
            cfg[key] = value

    tp_key = _R + "tensor_model_parallel_size"
    if tp_key in over:
        tp = int(over[tp_key])
        ok = [c for c in space[tp_key].choices or (tp,) if n_gpus % int(c) == 0 and int(c) <= per_node]
        if ok and tp not in ok:
            fit(tp_key, max((c for c in ok if c <= tp), default=min(ok)))
    n_key, train_key, mini_key = _R + "n", "data.train_batch_size", _A + "ppo_mini_batch_size"
    if n_key in over and str(cfg.get("algorithm.adv_estimator")) == "grpo" and int(over[n_key]) < 2:
        fit(n_key, 2)
    n = int(_get(cfg, n_key, 1))
    if train_key in over:  # train x n divisible by the GPU count
        unit = n_gpus // math.gcd(n, n_gpus)
        fit(train_key, max(unit, int(over[train_key]) // unit * unit))
    train = int(_get(cfg, train_key, 1024))
    sp = int(_get(cfg, _A + "ulysses_sequence_parallel_size", 1))
    dp = max(1, n_gpus // max(1, sp))
    if sp > 1 and "actor_rollout_ref.model.use_remove_padding" in space:
        fit("actor_rollout_ref.model.use_remove_padding", True)
    dyn = bool(_get(cfg, _A + "use_dynamic_bsz", False))
    micro_key = _A + "ppo_micro_batch_size_per_gpu"
    micro = int(_get(cfg, micro_key, 1)) if not dyn else 1
    if mini_key in over:  # mini <= train, and mini x n a multiple of dp x micro (micro is stage 1's)
        need = dp * micro // math.gcd(n, dp * micro)
        if need > train and train_key in over:  # the smallest legal mini batch needs a larger train batch
            unit = n_gpus // math.gcd(n, n_gpus)
            fit(train_key, -(-need // unit) * unit)
            train = int(_get(cfg, train_key, 1024))
        fit(mini_key, max(need, min(int(over[mini_key]), train) // need * need))
    per_gpu_mini = int(_get(cfg, mini_key, 256)) * n // dp
    if not dyn and per_gpu_mini >= 1 and micro_key in over:
        fit(micro_key, _largest_divisor_le(per_gpu_mini, int(_get(cfg, micro_key, 1))))
    cap_key = _A + "ppo_max_token_len_per_gpu"
    if dyn and cap_key in over and int(over[cap_key]) * sp < seq:
        fit(cap_key, -(-seq // sp))
    mnbt_key = _R + "max_num_batched_tokens"
    if mnbt_key in over and not bool(_get(cfg, _R + "enable_chunked_prefill", True)) and int(over[mnbt_key]) < seq:
        fit(mnbt_key, seq)
    return over


def config_key(base: dict[str, Any], overrides: dict[str, Any]) -> str:
    """Identity of a full config (to avoid running the same config twice: optuna#3472)."""
    return repr(sorted((k, repr(v)) for k, v in {**base, **overrides}.items()))


def random_overrides(space: SearchSpace, stage: str, base: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Every knob of the stage drawn at random (one draw; the driver repairs and redraws)."""
    return {p.key: sample_param(p, rng) for p in space.stage_params(stage)}  # type: ignore[arg-type]


def grid_levels(p: ParamSpec) -> list[Any]:
    """Default first, then up to two alternatives a user would try (toward the far end, then the near end)."""
    d = p.default
    if p.kind == "bool":
        return [bool(d), not bool(d)]
    if p.kind == "categorical":
        rest = [c for c in p.choices if c != d]
        return [d, *rest[:2]]
    lo, hi = float(p.low), float(p.high)
    if d is None:
        d = lo
    if p.kind == "float":
        up = d + 0.5 * (hi - d)
        far = d + 0.9 * (hi - d) if hi > d else lo
        levels = [d, round(up, 4), round(far, 4)]
    else:
        up, down = min(hi, d * 4), max(lo, d / 4)
        if p.kind == "int":
            up, down = round(up), round(down)
        levels = [d, up, down]
    out: list[Any] = []
    for v in levels:
        if v not in out:
            out.append(v)
    return out


def grid_points(space: SearchSpace, stage: str, base: dict[str, Any], budget: int) -> list[dict[str, Any]]:
    """A full grid over the stage's first knobs (catalogue order = verl's perf-guide order), within budget.

    Knobs are added while the grid still fits the budget; the all-default point comes first. Points
    breaking verl's constraints are dropped (they would not launch).
    """
    params = space.stage_params(stage)  # type: ignore[arg-type]
    chosen: list[tuple[str, list[Any]]] = []
    size = 1
    for p in params:
        levels = grid_levels(p)
        if size * len(levels) <= budget:
            chosen.append((p.key, levels))
            size *= len(levels)
        elif size * 2 <= budget and len(levels) > 2:
            chosen.append((p.key, levels[:2]))
            size *= 2
    points = []
    for values in itertools.product(*[lv for _, lv in chosen]):
        over = {k: v for (k, _), v in zip(chosen, values) if v != base.get(k, space[k].default)}
        if valid(space, base, over):
            points.append(over)
    return points[:budget]


def optuna_suggest(trial, space: SearchSpace, stage: str) -> dict[str, Any]:
    """The stage's knobs through Optuna's define-by-run API (same ranges and scales as random search)."""
    out: dict[str, Any] = {}
    for p in space.stage_params(stage):  # type: ignore[arg-type]
        if p.kind == "bool":
            out[p.key] = trial.suggest_categorical(p.key, [False, True])
        elif p.kind == "categorical":
            out[p.key] = trial.suggest_categorical(p.key, list(p.choices))
        elif p.kind == "log":
            out[p.key] = trial.suggest_float(p.key, float(p.low), float(p.high), log=True)
        elif p.kind == "float":
            out[p.key] = trial.suggest_float(p.key, float(p.low), float(p.high))
        else:
            out[p.key] = trial.suggest_int(p.key, int(p.low), int(p.high), log=_log_int(p))
    return out


def defaults_params(space: SearchSpace, stage: str, base: dict[str, Any]) -> dict[str, Any]:
    """The stage's knobs at the base config's values (for ``study.enqueue_trial``)."""
    out = {}
    for p in space.stage_params(stage):  # type: ignore[arg-type]
        v = base.get(p.key, p.default)
        out[p.key] = p.low if v is None and p.kind in ("int", "float", "log") else v
    return out
