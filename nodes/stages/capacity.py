"""The schedule stage's capacity rule, which its policy admits candidates by and its agents build them with: a
segment may lengthen the response limit (``data.max_response_length``), and the system knobs flagged
``ParamSpec.schedule`` (token caps that must hold the longest sequence) follow it, only up."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mart.state.trajectory import Trajectory, line_fit, mean, tail

if TYPE_CHECKING:
    from mart.nodes.agents.base import AgentContext
    from mart.state.search_space import ParamSpec


def knob_spec(ctx: AgentContext, suffix: str) -> ParamSpec | None:
    for p in ctx.search_space.stage_params(ctx.stage):
        if p.key == suffix or p.key.endswith("." + suffix):
            return p
    return None


def knob_key(ctx: AgentContext, suffix: str) -> str | None:
    spec = knob_spec(ctx, suffix)
    return spec.key if spec else None


def direction(old: Any, new: Any) -> str | None:
    if isinstance(new, bool) or isinstance(old, bool):
        return None if bool(old) == bool(new) else ("up" if new else "down")
    try:
        return None if float(new) == float(old) else ("up" if float(new) > float(old) else "down")
    except (TypeError, ValueError):
        return None


def fmt_value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v)


def grew_capacity(ctx: AgentContext, overrides: dict[str, Any]) -> bool:
    key = knob_key(ctx, "max_response_length")
    if key is None or key not in overrides:
        return False
    old = ctx.base_config.get(key, ctx.search_space[key].default)
    return direction(old, overrides[key]) == "up"


def implied_caps(ctx: AgentContext, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``overrides`` with the token caps a longer response limit implies (the system knobs flagged
    ``ParamSpec.schedule``: verl's dynamic-batch ``ppo_max_token_len_per_gpu`` must hold the longest sequence, its
    ``max_num_batched_tokens`` too without chunked prefill), each doubled until the backend's rules hold, and the
    moves as text. Unchanged when the limit does not grow or no flagged knob is named by a broken rule."""
    if not grew_capacity(ctx, overrides):
        return overrides, []
    flagged = [p for p in ctx.search_space.params if p.schedule and p.kind == "int"]
    out, moved = dict(overrides), []
    for _ in range(6):  # 2^6: far past any response-limit stage
        errors = ctx.config_errors(out)
        hit = [p for p in flagged if any(p.key.rsplit(".", 1)[-1] in e for e in errors)]
        if not errors or not hit:
            break
        for p in hit:
            old = ctx.full_config(out).get(p.key, p.default)
            if not isinstance(old, (int, float)) or old >= (p.high or old):
                continue
            out[p.key] = int(min(p.high or 2 * old, 2 * old))
    for p in flagged:
        if p.key in out and p.key not in overrides:
            moved.append(f"{p.key.rsplit('.', 1)[-1]} {fmt_value(ctx.base_config.get(p.key, p.default))}->{fmt_value(out[p.key])}")
    return out, moved


def capacity_errors(ctx: AgentContext, overrides: dict[str, Any]) -> list[str]:
    """Why a schedule transition's system knobs are refused: a flagged token cap (``ParamSpec.schedule``) may move
    only up, and only with the response limit it follows (a schedule changes learning knobs, and the capacity they
    imply); a micro batch (``ParamSpec.memory_safe``) only down (memory, never the update's math)."""
    out = []
    grew = grew_capacity(ctx, overrides)
    for key, value in overrides.items():
        spec = ctx.search_space[key] if key in ctx.search_space else None
        if spec is None or spec.stage != "system" or not (spec.schedule or spec.memory_safe):
            continue
        if spec.memory_safe and not spec.schedule:  # a micro batch: lowered for memory, never raised
            if direction(ctx.base_config.get(key, spec.default), value) == "up":
                out.append(f"`{key}` is a system knob: a schedule may only lower it, for memory")
            continue
        if not grew or direction(ctx.base_config.get(key, spec.default), value) != "up":
            out.append(f"`{key}` is a system knob: a schedule may only raise it with data.max_response_length, "
                       "as the longer limit implies")
    return out


# --- memory along a schedule: the peak projected to the horizon, and the micro batches that keep it in memory ----
#: verl's per-step peak of allocated GPU memory (the metric stream every backend writes)
PEAK_MEMORY = "perf/max_memory_allocated_gb"


def memory_trend(records: Sequence[Any], now_steps: int = 3) -> tuple[float | None, float | None]:
    """A path's peak memory now (the mean of its last ``now_steps`` steps: one step's peak is noisy) and its
    growth in GB per step: the larger of the least-squares slopes over the whole path and over its last half.
    Responses lengthen as the policy learns, and faster once a longer limit lets them (a peak that grew 0.14
    GB/step over the first segment grew ~1 GB/step after the limit doubled): the whole path's slope alone lags
    the growth a later segment meets. (None, None) without the metric."""
    pts = Trajectory(list(records)).sorted_by_step().first_series(PEAK_MEMORY)
    if not pts:
        return None, None
    level = mean(tail(pts, now_steps))
    slopes = []
    for part in (pts, pts[len(pts) // 2:]):
        if len(part) >= 2:
            _, _, sxx, slope = line_fit(part)
            if sxx > 0:
                slopes.append(slope)
    return level, (max(slopes) if slopes else None)


def projected_peak(level: float, slope: float | None, steps_left: int, speed: float = 1.0) -> float:
    """The peak at the schedule's end: ``level`` plus its growth (never a shrink) over ``steps_left``, scaled by
    ``speed``, the next segment's step size against the path's (learning, and the lengthening with it, goes as
    the step: a doubled lr doubles it)."""
    return level + max(0.0, slope or 0.0) * max(0, steps_left) * speed


def halved_micro_batches(params: Sequence[ParamSpec], config: dict[str, Any],
                         errors: Callable[[dict[str, Any]], list[str]]) -> tuple[dict[str, Any], list[str]]:
    """The micro batches (``ParamSpec.memory_safe`` int knobs) of the full ``config`` halved, as overrides, with
    the moves as text; ({}, []) when none can halve or the backend refuses the halved config (``errors`` of the
    full config: a mini batch it no longer divides). A micro batch changes no update's math (gradients
    accumulate to the same mini batch): learning is what it was, at some throughput."""
    out, moved = {}, []
    for p in params:
        if not p.memory_safe or p.kind != "int":
            continue
        old = config.get(p.key, p.default)
        low = int(p.low or 1)
        if not isinstance(old, (int, float)) or isinstance(old, bool) or old <= low:
            continue
        out[p.key] = max(low, int(old) // 2)
        moved.append(f"{'.'.join(p.key.split('.')[-2:])} {fmt_value(old)}->{fmt_value(out[p.key])}")
    if not out or errors({**config, **out}):
        return {}, []
    return out, moved
