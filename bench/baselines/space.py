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


def valid(space: SearchSpace, base: dict[str, Any], overrides: dict[str, Any]) -> bool:
    return not space.check_constraints({**base, **overrides})


def random_overrides(space: SearchSpace, stage: str, base: dict[str, Any], rng: random.Random,
                     tries: int = 500) -> dict[str, Any]:
    """Every knob of the stage drawn at random, redrawn until verl's constraints hold (redraws are free)."""
    params = space.stage_params(stage)  # type: ignore[arg-type]
    for _ in range(tries):
        over = {p.key: sample_param(p, rng) for p in params}
        if valid(space, base, over):
            return over
    return {}


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
