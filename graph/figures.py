"""A session's result as text: one rendering of each figure for every channel that shows it.

The numbers come from the summary (``StagePolicy.summary``, computed once; the ledger's ``stage_results`` holds
the same ones), and the terminal table, Slack's final message and the report's headline all write them through
the functions here, so a stage's baseline, best and gain read the same everywhere. Knob names are the keys'
last segments, with the phase prefix where two of them would read the same (``display_names``); a stage whose
baseline stayed the best says so instead of printing a signed zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mart.state.agents import group_by_agent
from mart.state.config_values import format_value
from mart.state.search_space import display_names
from mart.state.stages import traits
from mart.state.units import fmt_steps

KEPT = "kept the baseline"
KEPT_STATIC = "kept the static config"


def knob_lines(overrides: dict[str, Any] | None) -> list[str]:
    """``name=value`` for each changed knob, unambiguous names; a multi-agent job's knobs one line per agent."""
    shared, per_agent = group_by_agent(overrides or {})
    names = display_names(shared)
    lines = [f"{names[k]}={format_value(v)}" for k, v in sorted(shared.items(), key=lambda kv: names[kv[0]])]
    for agent, knobs in per_agent.items():
        own = display_names(knobs)
        lines.append(f"agent {agent}: " + ", ".join(f"{own[k]}={format_value(v)}"
                                                    for k, v in sorted(knobs.items(), key=lambda kv: own[kv[0]])))
    return lines


def knob_text(overrides: dict[str, Any] | None, sep: str = ", ") -> str:
    return sep.join(knob_lines(overrides))


@dataclass
class StageFigure:
    """One stage's row: what it measures, its baseline and best as text, the gain (or that nothing changed)."""

    stage: str
    label: str
    baseline: str
    best: str
    gain: str
    kept: bool
    config: list[str]
    #: the schedule stage's cost as text: GPU-hours of one run with the static config, with the schedule, and of the
    #: whole search (None where the backend reports no step timings, and for the other stages)
    hours: tuple[str, str, str] | None = None
    #: how sure the gain is: its interval and the measurements behind it (``interval_text``), or None
    interval: str | None = None

    def sentence(self) -> str:
        """``learning stage (val score): 0.5304 → 0.5304, kept the baseline``; the gain's interval and a
        schedule's GPU-hours after it."""
        text = f"{self.stage} stage ({self.label}): {self.baseline} → {self.best}, {self.gain}"
        return text + (f"; {self.interval}" if self.interval else "") + (f"; {self.hours_text()}" if self.hours else "")

    def hours_text(self) -> str:
        """``GPU-hours of one run 7.06 → 7.06 (search 16.3)``."""
        static, best, search = self.hours or ("-", "-", "-")
        return f"GPU-hours of one run {static} → {best} (search {search})"


def _num(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def interval_text(part: dict[str, Any], stage: str) -> str | None:
    """A stage's ``gain_interval`` in words, with the number of measurements behind it: what was measured (stage 1:
    the interleaved re-measurement), the interval, and, for a kept baseline, that it is the gain not confirmed.
    None when the stage has none (no candidate above the baseline, or nothing re-measured)."""
    from mart.state.stats import Interval

    raw = part.get("gain_interval")
    if not isinstance(raw, dict):
        return None
    try:
        iv = Interval.from_json(raw)
        text = iv.describe()
    except (KeyError, TypeError, ValueError):
        return None
    if traits(stage).remeasures:  # stage 1: measured again, interleaved with the baseline, not the selecting run
        rounds = (part.get("remeasure") or {}).get("rounds")
        text = f"re-measured interleaved ({rounds} round(s)): {text}"
    if part.get("kept_baseline"):
        text = f"not confirmed: {text}"
    return text


def stage_figures(summary: dict[str, Any]) -> list[StageFigure]:
    """The figures of each stage the session ran, from its summary (``mart tune --json``'s object)."""
    ran = summary.get("stages") or ["system", "learning"]  # a summary stored before --stages: both
    out = []
    sys_ = summary.get("system") or {}
    if "system" in ran and sys_:
        kept = bool(sys_.get("kept_baseline"))
        # the gain and the two figures it compares, from one computation (a summary stored before it: its keys)
        cmp_ = sys_.get("comparison") or {"steps": sys_.get("baseline_steps"), "baseline": sys_.get(
            "baseline_throughput"), "best": sys_.get("best_throughput"), "gain_pct": sys_.get("throughput_gain_pct")}
        gain = cmp_.get("gain_pct")
        base, best = _num(cmp_.get("baseline"), ",.0f"), _num(cmp_.get("best"), ",.0f")
        steps = cmp_.get("steps")
        if cmp_.get("measured") == "re-measured":
            # the taken config's gain is the re-measurement's; the selecting run's higher figure beside it
            base += " (re-measured)"
            best += " (re-measured" + (f"; {_num(sys_.get('best_throughput'), ',.0f')} when selected"
                                       if sys_.get("best_throughput") is not None else "") + ")"
        elif sys_.get("baseline_cut") and steps:
            # cut at its look: both figures and the gain are over the steps it ran; the best's own figure beside
            where = fmt_steps(*steps)
            base += f" ({where})"
            if cmp_.get("best") is not None and sys_.get("best_throughput") is not None:
                own = sys_.get("best_steps")
                best += (f" ({where}; {_num(sys_.get('best_throughput'), ',.0f')} over "
                         f"{fmt_steps(*own) if own else 'its own steps'})")
        out.append(StageFigure(
            "system", "tok/s/GPU", base, best,
            KEPT if kept else ("-" if gain is None else f"{gain:+.1f}%"), kept, knob_lines(sys_.get("best_config")),
            interval=interval_text(sys_, "system")))
    learn = summary.get("learning") or {}
    if "learning" in ran and learn:
        kept = bool(learn.get("kept_baseline"))
        gain = learn.get("score_gain")
        runs = learn.get("best_score_runs") or 0
        best = _num(learn.get("best_score"), ".4f") + (f" (mean of {runs} runs)" if runs > 1 and not kept else "")
        out.append(StageFigure(
            "learning", "val score", _num(learn.get("baseline_score"), ".4f"), best,
            KEPT if kept else ("-" if gain is None else f"{gain:+.4f}"), kept, knob_lines(learn.get("best_config")),
            interval=interval_text(learn, "learning")))
    sched = summary.get("schedule")
    if sched is not None:
        segs = sched.get("segments") or []
        kept = bool(segs) and not any(s.get("changes") for s in segs)
        gain = sched.get("gain")
        lines = [f"steps {s['from_step']}-{s['to_step']}: " + (knob_text(s["changes"]) if s.get("changes") else
                                                               "unchanged") for s in segs] or ["no complete schedule"]
        hours = None
        if any(sched.get(k) is not None for k in ("static_gpu_hours", "gpu_hours", "search_gpu_hours")):
            hours = (_num(sched.get("static_gpu_hours"), ".3g"), _num(sched.get("gpu_hours"), ".3g"),
                     _num(sched.get("search_gpu_hours"), ".3g"))
        out.append(StageFigure(
            "schedule", f"val score, {sched.get('branches_run')} segment-trials",
            _num(sched.get("static_best_score"), ".4f"), _num(sched.get("final_score"), ".4f"),
            KEPT_STATIC if kept else ("-" if gain is None else f"{gain:+.4f}"), kept, lines, hours,
            interval=interval_text(sched, "schedule")))
    return out
