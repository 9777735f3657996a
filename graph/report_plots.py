"""The report's figures drawn: matplotlib PNGs of a run's best-so-far, phase breakdown, memory, calibration,
time axis and learning curves, from ``mart.graph.report_data``. matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mart.graph.report_data import (
    CURVES,
    RunData,
    curve_panels,
    learning_best,
    loads,
    objective,
    series,
    system_best,
    timeline,
)
from mart.state.files import ensure_dir, write_atomic
from mart.state.stages import traits
from mart.state.units import fmt_gb

PHASES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def _mean(values: list[float]) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else 0.0


def _plot_learning_best(data: RunData, ax: Any, label: str) -> bool:
    """Stage 2's runs as points; the change its verdict took (if any) as the line, the baseline dashed."""
    trials = data.stage_trials("learning")
    if not trials:
        return False
    lb = learning_best(data)
    single, reran = lb.single, lb.reran
    if single:
        ax.plot([x for x, _ in single], [y for _, y in single], "o", mfc="none", color="0.5",
                label="single run (unconfirmed)")
    if reran:
        ax.plot([x for x, _ in reran], [y for _, y in reran], "o", color="0.35", ms=4, label="run of a re-run config")
    if lb.taken is not None:  # drawn half a trial past the last one, so that a rise at the last trial shows
        ax.step([*lb.xs, lb.xs[-1] + 0.5], [*lb.line, lb.line[-1]], where="post", color="C0", lw=2,
                label=f"taken: {lb.taken} (mean of its runs)")
    learn = data.summary.get("learning") or {}
    base = learn.get("baseline_score")
    if base is None:
        base = next((objective(t) for t in trials if t.get("kind") == "baseline"), None)
    if base is not None:
        ax.axhline(base, color="C3", ls="--", lw=1,
                   label="baseline (kept)" if learn.get("kept_baseline") else "baseline")
    ax.set_title(f"learning stage: {label}")
    ax.set_xlabel("trial")
    ax.legend(fontsize=7)
    return bool(single or reran) or base is not None


def _plot_best_so_far(data: RunData, ax: Any, stage: str, label: str) -> bool:
    if traits(stage).confirms:  # means over seeds, with the re-runs drawn
        return _plot_learning_best(data, ax, label)
    sb = system_best(data)
    if not sb.xs:
        return False
    ax.plot(sb.xs, sb.each, "o", color="0.6", label="each trial")
    ax.step(sb.xs, sb.best, where="post", color="C0", lw=2, label="best so far")
    if sb.baseline is not None:
        from mart.state.units import fmt_steps

        where = f" ({fmt_steps(*sb.baseline_steps)}, cut there)" if sb.baseline_steps else ""
        if sb.baseline_x is not None:
            ax.plot([sb.baseline_x], [sb.baseline], "s", color="C3", ms=6)
        ax.axhline(sb.baseline, color="C3", ls="--", lw=1, label="baseline" + where)
    ax.set_title(f"{stage} stage: {label}")
    ax.set_xlabel("trial")
    ax.legend(fontsize=8)
    return True


_STATUS_COLOR = {"completed": "C2", "stopped": "C1", "oom": "C3", "failed": "C3"}


def _plot_gantt(data: RunData, ax: Any) -> bool:
    """One bar per trial on its slot's row: when it ran, coloured by how it ended."""
    rows = timeline(data)
    if len(rows) < 2:
        return False
    for t in rows:
        slot = int(t.get("slot") or 0)
        ax.barh(slot, t["t_end"] - t["t_start"], left=t["t_start"], height=0.7,
                color=_STATUS_COLOR.get(t["status"], "0.6"), edgecolor="white", alpha=0.85 if t["stage"] == "system" else 0.6)
        ax.text(t["t_start"], slot, f" {t['trial_id']}", va="center", fontsize=6, clip_on=True)
    slots = sorted({int(t.get("slot") or 0) for t in rows})
    ax.set_yticks(slots, [f"slot {s}" for s in slots])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first trial started")
    ax.set_title("trials on a time axis (green completed, orange stopped, red failed/OOM; pale: later stages)")
    return True


def _plot_best_vs_time(data: RunData, ax: Any, stage: str, label: str) -> bool:
    """Best-so-far against wall clock: the stage's best eligible objective as its trials end."""
    limit = data.memory_limit_gb() if traits(stage).memory_bound else None
    rows = sorted((t for t in timeline(data) if t["stage"] == stage), key=lambda t: t["t_end"])
    if traits(stage).confirms:
        return _plot_learning_vs_time(data, ax, rows, label)
    xs, ys, cur = [], [], None
    for t in rows:
        v = objective(t)
        ok = t["status"] == "completed" and v is not None and not t.get("early_stopped")
        if ok and limit is not None and (t["peak_memory_gb"] or 0) > limit:
            ok = False
        if ok:
            cur = v if cur is None else max(cur, v)
        xs.append(t["t_end"])
        ys.append(cur)
    if not xs:
        return False
    ax.step(xs, [y if y is not None else math.nan for y in ys], where="post", color="C0", lw=2)
    ax.plot(xs, [y if y is not None else math.nan for y in ys], "o", color="C0", ms=3)
    ax.set_title(f"{stage} stage: best {label}")  # the section says "against wall clock"; two panels share a row
    ax.set_xlabel("seconds since the first trial started")
    return True


def _plot_learning_vs_time(data: RunData, ax: Any, rows: list[dict[str, Any]], label: str) -> bool:
    """Stage 2 against wall clock by its own rule: each run's score when it ended, and the change the verdict took
    (its mean) from when its last run ended; a single run's score is never drawn as the stage's best."""
    pts = [(t["t_end"], objective(t)) for t in rows if t["status"] == "completed" and not t.get("early_stopped")
           and objective(t) is not None]
    if not pts:
        return False
    ax.plot([x for x, _ in pts], [y for _, y in pts], "o", color="0.5", ms=3, label="a run ends")
    lb = learning_best(data)
    if lb.taken is not None:
        since = max(t["t_end"] for t in rows if lb.taken in (t["trial_id"], t.get("confirms")))
        ax.hlines(lb.line[-1], since, max(x for x, _ in pts), color="C0", lw=2, label=f"taken: {lb.taken}")
    base = (data.summary.get("learning") or {}).get("baseline_score")
    if base is not None:
        ax.axhline(base, color="C3", ls="--", lw=1, label="baseline")
    ax.set_title(f"learning stage: {label}")
    ax.set_xlabel("seconds since the first trial started")
    ax.legend(fontsize=7)
    return True


def _drop_empty(fig: Any, axes: Any, drawn: tuple[bool, ...]) -> bool:
    """Remove the panels that got no data (a stage that did not run); False when none did."""
    for ax, ok in zip(axes, drawn):
        if not ok:
            ax.remove()
    return any(drawn)


def _figure(path: Path, draw: Any, size: tuple[float, float] = (7.5, 3.6)) -> Path | None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=size, dpi=100)
    try:
        if draw(fig) is False:
            return None
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png")
        # the run folder is untrusted: a PNG planted as a link is replaced, never written through
        return write_atomic(path.parent, path.name, png.getvalue())
    finally:
        plt.close(fig)


def draw_figures(data: RunData, out_dir: Path) -> dict[str, Path]:
    """Write the report's PNGs into ``out_dir``; returns those that had data, by name."""
    ensure_dir(out_dir.parent, out_dir.name)  # a real folder, not a link planted in the run folder
    figs: dict[str, Path | None] = {}
    system, learning = data.stage_trials("system"), data.stage_trials("learning")

    def best(fig: Any) -> bool:
        axes = fig.subplots(1, 2)
        a = _plot_best_so_far(data, axes[0], "system", "throughput (tok/s/GPU)")
        b = _plot_best_so_far(data, axes[1], "learning", "validation score")
        return _drop_empty(fig, axes, (a, b))

    figs["best_so_far"] = _figure(out_dir / "best_so_far.png", best)

    def gantt(fig: Any) -> bool:
        return _plot_gantt(data, fig.subplots(1, 1))

    slots = {int(t.get("slot") or 0) for t in data.trials}
    if len(slots) > 1:  # several trials ran side by side: when they ran, and what the wall clock bought
        figs["timeline"] = _figure(out_dir / "timeline.png", gantt, size=(10.0, 1.2 + 0.45 * len(slots)))

        def best_time(fig: Any) -> bool:
            axes = fig.subplots(1, 2)
            a = _plot_best_vs_time(data, axes[0], "system", "throughput")
            b = _plot_best_vs_time(data, axes[1], "learning", "validation score")
            return _drop_empty(fig, axes, (a, b))

        figs["best_vs_time"] = _figure(out_dir / "best_vs_time.png", best_time)

    def phases(fig: Any) -> bool:
        if not system:
            return False
        ax = fig.subplots()
        bottom = [0.0] * len(system)
        for i, ph in enumerate(PHASES):
            vals = [_mean([v for _, v in data.metrics.get(t["trial_id"], {}).get(f"timing_s/{ph}", [])])
                    for t in system]
            if any(vals):
                ax.bar(range(len(system)), vals, bottom=bottom, label=ph, color=f"C{i}")
                bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(system)), [t["trial_id"] for t in system], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("mean seconds per step")
        ax.set_title("where each system trial spends its step")
        ax.legend(fontsize=7, ncol=3)
        return True

    figs["phases"] = _figure(out_dir / "phases.png", phases)

    def memory(fig: Any) -> bool:
        pts = [(t["trial_id"], t["peak_memory_gb"], t["status"]) for t in data.trials
               if t["peak_memory_gb"] is not None]
        if not pts:
            return False
        ax = fig.subplots()
        colors = ["C3" if s in ("oom", "failed") else "C0" for _, _, s in pts]
        ax.bar(range(len(pts)), [p for _, p, _ in pts], color=colors)
        limit = data.memory_limit_gb()
        if limit is not None:
            ax.axhline(limit, color="C3", ls="--", lw=1, label=f"limit {fmt_gb(limit)}")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(pts)), [t for t, _, _ in pts], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("peak memory (GB)")
        ax.set_title("peak memory per trial (red: OOM or failed)")
        return True

    figs["memory"] = _figure(out_dir / "memory.png", memory)

    def calibration(fig: Any) -> bool:
        pairs = []
        for t in data.trials:
            p = data.proposals.get(t.get("candidate_id") or "")
            if p and p.get("predicted_memory_gb") is not None and t["peak_memory_gb"] is not None:
                pairs.append((p["predicted_memory_gb"], t["peak_memory_gb"]))
        if not pairs:
            return False
        ax = fig.subplots()
        ax.scatter([p for p, _ in pairs], [m for _, m in pairs], color="C0")
        lo = min(min(p, m) for p, m in pairs)
        hi = max(max(p, m) for p, m in pairs)
        ax.plot([lo, hi], [lo, hi], color="0.5", ls=":", label="prediction = measurement")
        ax.set_xlabel("predicted peak (GB)")
        ax.set_ylabel("measured peak (GB)")
        ax.set_title("memory model calibration")
        ax.legend(fontsize=8)
        return True

    figs["calibration"] = _figure(out_dir / "calibration.png", calibration, size=(5.0, 4.0))

    def curves(fig: Any) -> bool:
        if not learning:
            return False
        stops = {(e["trial_id"]): e for e in data.health if e["severity"] == "stop"}
        # only the curves some trial logs get a panel: a multi-agent job logs no team-level entropy or KL
        drawn_titles = curve_panels(data)
        present = [(title, prefixes) for title, prefixes in CURVES if title in drawn_titles]
        if not present:
            return False
        cols = min(3, len(present))
        axes = fig.subplots(math.ceil(len(present) / cols), cols, squeeze=False).ravel()
        for ax in axes[len(present):]:
            ax.remove()
        drawn = False
        for ax, (title, prefixes) in zip(axes, present):
            for i, t in enumerate(learning):
                s = series(data, t["trial_id"], prefixes)
                if not s:
                    continue
                drawn = True
                ax.plot([a for a, _ in s], [b for _, b in s], color=f"C{i % 10}", lw=1.2, label=t["trial_id"],
                        marker="o" if len(s) < 3 else None)
                ev = stops.get(t["trial_id"])
                if ev is not None:
                    ax.axvline(ev["step"], color=f"C{i % 10}", ls=":", lw=1)
            ax.set_title(title, fontsize=9)
            ax.tick_params(labelsize=7)
        if drawn:
            axes[0].legend(fontsize=6)
        return drawn

    figs["learning_curves"] = _figure(out_dir / "learning_curves.png", curves, size=(10.0, 5.6))

    def schedule_tree(fig: Any) -> bool:
        # one line per segment-trial, from its branch point: the static path grey, the winning schedule bold
        nodes = [t for t in data.stage_trials("schedule") if not t.get("confirms")]
        sched = (data.summary or {}).get("schedule") or {}
        winning = {s.get("trial_id") for s in sched.get("segments") or []}
        static_ids, cur = set(), next((t for t in nodes if not t.get("parent_trial")), None)
        while cur is not None:
            static_ids.add(cur["trial_id"])
            cur = next((t for t in nodes if t.get("parent_trial") == cur["trial_id"]
                        and not loads(t.get("overrides"), {})), None)
        ax = fig.subplots()
        drawn = False
        ends = {t["trial_id"]: series(data, t["trial_id"], ("val-core/",)) for t in nodes}
        for t in nodes:
            pts = ends[t["trial_id"]]
            start = t.get("parent_step")
            if start is not None:  # a branch: drawn on from its parent's last point (the checkpoint's score)
                before = [p for p in ends.get(t.get("parent_trial"), []) if p[0] == start][-1:]
                pts = before + [p for p in pts if p[0] > start]
            if not pts:
                continue
            drawn = True
            win, static = t["trial_id"] in winning, t["trial_id"] in static_ids
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", ms=3,
                    color="C3" if win else ("0.45" if static else "C0"), lw=2.2 if win else 1.0,
                    alpha=1.0 if win or static else 0.5)
        for b in sched.get("boundaries") or []:
            ax.axvline(b, color="0.8", lw=0.8, ls=":")
        ax.set_xlabel("global step")
        ax.set_ylabel("validation score")
        ax.set_title("schedule tree (red: the chosen schedule, grey: the static config, blue: other branches)",
                     fontsize=9)
        return drawn

    figs["schedule_tree"] = _figure(out_dir / "schedule_tree.png", schedule_tree)
    return {k: v for k, v in figs.items() if v is not None}
