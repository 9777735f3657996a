"""``mart report RUN``: one self-contained HTML page (or Markdown) of a run, drawn from its ledger.

What a reviewer wants at a glance: best-so-far per stage against the baseline, where each system trial
spent its step (phase breakdown), peak memory against the limit, how well the predictions matched, the
learning curves with the health monitor's stops, who decided what, and the final config as verl
overrides and as YAML. Figures are matplotlib PNGs, written beside the page and embedded in it (data URIs),
so the HTML file can be mailed or attached on its own.

The ledger is opened read-only; every string from it (feedback, reasons, configs) is foreign text and is
escaped before it reaches the page.
"""

from __future__ import annotations

import base64
import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from mart.state.files import ensure_dir, write_atomic
from mart.state.ledger import DB_FILE
from mart.state.stages import traits
from mart.state.text import html_text, md_fence, md_text, plain
from mart.state.units import fmt_gb

PHASES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
CURVES = (  # (title, metric prefixes tried in order)
    ("reward", ("critic/score/mean", "critic/rewards/mean")),
    ("validation score", ("val-core/",)),
    ("entropy", ("actor/entropy",)),
    ("KL", ("actor/kl_loss", "actor/ppo_kl")),
    ("response length", ("response_length/mean",)),
    ("response clip ratio", ("response_length/clip_ratio",)),
)
REPORT_DIR = "report"


@dataclass
class RunData:
    """What the report needs from one run's ledger."""

    run_id: str
    options: dict[str, Any]
    status: str
    summary: dict[str, Any]
    trials: list[dict[str, Any]]
    metrics: dict[str, dict[str, list[tuple[int, float]]]]  # trial -> key -> [(step, value)]
    reviews: list[dict[str, Any]]
    proposals: dict[str, dict[str, Any]]
    health: list[dict[str, Any]]
    stages: dict[str, dict[str, Any]]
    profiles: dict[str, dict[str, Any]]
    figures: dict[str, Path] = field(default_factory=dict)

    def stage_trials(self, stage: str) -> list[dict[str, Any]]:
        return [t for t in self.trials if t["stage"] == stage]

    def memory_limit_gb(self) -> float | None:
        for p in self.profiles.values():
            if p.get("memory_limit_gb") is not None:
                return float(p["memory_limit_gb"])
        return None


def _loads(text: str | None, default: Any) -> Any:
    try:
        return json.loads(text) if text else default
    except ValueError:
        return default


def load_run(run_dir: str | Path) -> RunData:
    """Read a run's ledger (read-only, so a report works on a run that is still going or on read-only media)."""
    from mart.state.run_store import RunStore

    db = Path(run_dir) / DB_FILE
    if not db.is_file():
        raise FileNotFoundError(f"{run_dir}: no {DB_FILE} (is this a mart run folder?)")
    RunStore.open(run_dir, Path(run_dir).parent, readonly=True).close()  # NotAMartRun: not a run's ledger
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row

    def rows(sql: str, *args: Any) -> list[dict[str, Any]]:
        try:
            return [dict(r) for r in conn.execute(sql, args)]
        except sqlite3.OperationalError:  # a table an older run does not have
            return []

    try:
        run = (rows("select * from runs") or [{}])[0]
        trials = rows("select * from trials order by seq")
        metrics: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for r in rows("select trial_id, step, key, value from metrics order by trial_id, step"):
            if r["value"] is not None:
                metrics.setdefault(r["trial_id"], {}).setdefault(r["key"], []).append((r["step"], r["value"]))
        return RunData(
            run_id=run.get("run_id") or Path(run_dir).name,
            options=_loads(run.get("options"), {}),
            status=run.get("status") or "unknown",
            summary=_loads(run.get("summary"), {}),
            trials=trials,
            metrics=metrics,
            reviews=rows("select * from reviews order by created_at"),
            proposals={p["candidate_id"]: p for p in rows("select * from proposals")},
            health=rows("select * from health_events order by trial_id, step"),
            stages={s["stage"]: s for s in rows("select * from stage_results")},
            profiles={p["stage"]: _loads(p["profile"], {}) for p in rows("select * from profiles")},
        )
    finally:
        conn.close()


# -- figures ---------------------------------------------------------------------------------------------

def _series(data: RunData, trial_id: str, prefixes: tuple[str, ...]) -> list[tuple[int, float]]:
    keys = data.metrics.get(trial_id, {})
    for prefix in prefixes:
        for key in sorted(keys):
            if key.startswith(prefix):
                return [(s, v) for s, v in keys[key] if math.isfinite(v)]
    return []


def _mean(values: list[float]) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else 0.0


def _objective(trial: dict[str, Any]) -> float | None:
    v = trial["throughput"] if trial["stage"] == "system" else trial["score"]
    return v if v is not None and math.isfinite(v) else None


#: the rule the learning stage's best-so-far plot draws, said under it
LEARNING_PLOT_RULE = (
    "Learning stage: the line is the best mean score of the configs run on two seeds (confirmed); the points are "
    "single runs (hollow: never confirmed). Stage 2 never picks a config from one run: a change replaces the "
    "baseline only when its mean over two seeds beats the baseline's by more than 2 standard errors of the "
    "difference, with no collapse signal. The dashed line is the baseline as the summary reports it.")


@dataclass
class LearningBest:
    """What the learning stage's best-so-far plot draws (x: the trial's number in the stage)."""

    xs: list[int]
    line: list[float]  # the best mean so far over configs run on two seeds (NaN before the first)
    single: list[tuple[int, float]]  # runs of configs run once (unconfirmed)
    reran: list[tuple[int, float]]  # runs of configs run on two seeds


def learning_best(data: RunData) -> LearningBest:
    """Stage 2's best so far by its own evidence rule: a config counts once its re-run on a second seed has ended
    (the mean of its healthy runs); a config run once is a point, never the line."""
    trials = data.stage_trials("learning")
    runs: dict[str, list[tuple[int, float]]] = {}  # config (its first trial) -> [(x, score)] of healthy runs
    for i, t in enumerate(trials, 1):
        v = _objective(t)
        if t["status"] == "completed" and v is not None and not t.get("early_stopped"):
            runs.setdefault(t.get("confirms") or t["trial_id"], []).append((i, v))
    confirmed = {k: r for k, r in runs.items() if len(r) >= 2}
    xs, line, cur = list(range(1, len(trials) + 1)), [], None
    for x in xs:
        means = [sum(v for _, v in r) / len(r) for r in confirmed.values() if max(i for i, _ in r) <= x]
        if means:
            cur = max(means)
        line.append(math.nan if cur is None else cur)
    return LearningBest(xs, line, [r[0] for k, r in runs.items() if k not in confirmed],
                        [p for r in confirmed.values() for p in r])


def _plot_learning_best(data: RunData, ax: Any, label: str) -> bool:
    """Stage 2's best so far by its own evidence rule: confirmed (re-run) means as the line, single runs as points."""
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
    if reran:  # drawn half a trial past the last one, so that a rise at the last trial shows
        ax.step([*lb.xs, lb.xs[-1] + 0.5], [*lb.line, lb.line[-1]], where="post", color="C0", lw=2,
                label="best confirmed mean (2 seeds)")
    learn = data.summary.get("learning") or {}
    base = learn.get("baseline_score")
    if base is None:
        base = next((_objective(t) for t in trials if t.get("kind") == "baseline"), None)
    if base is not None:
        ax.axhline(base, color="C3", ls="--", lw=1, label="baseline")
    ax.set_title(f"learning stage: {label}")
    ax.set_xlabel("trial")
    ax.legend(fontsize=7)
    return bool(single or reran) or base is not None


def _plot_best_so_far(data: RunData, ax: Any, stage: str, label: str) -> bool:
    if stage in _BEST_PLOTS:  # a stage with its own drawing (re-runs on other seeds)
        return _BEST_PLOTS[stage](data, ax, label)
    trials = data.stage_trials(stage)
    limit = data.memory_limit_gb() if traits(stage).memory_bound else None
    xs, best, ys, cur = [], [], [], None
    for i, t in enumerate(trials, 1):
        v = _objective(t)
        ok = t["status"] == "completed" and v is not None
        if ok and limit is not None and (t["peak_memory_gb"] or 0) > limit:
            ok = False  # over the margin never counts as best
        if ok:
            cur = v if cur is None else max(cur, v)
        xs.append(i)
        ys.append(v)
        best.append(cur)
    if not xs:
        return False
    ax.plot(xs, [y if y is not None else math.nan for y in ys], "o", color="0.6", label="each trial")
    ax.step(xs, [b if b is not None else math.nan for b in best], where="post", color="C0", lw=2,
            label="best so far")
    if ys and ys[0] is not None:
        ax.axhline(ys[0], color="C3", ls="--", lw=1, label="baseline")
    ax.set_title(f"{stage} stage: {label}")
    ax.set_xlabel("trial")
    ax.legend(fontsize=8)
    return True


#: the stages whose best-so-far figure is drawn their own way
_BEST_PLOTS: dict[str, Callable[[RunData, Any, str], bool]] = {"learning": _plot_learning_best}


def _timeline(data: RunData) -> list[dict[str, Any]]:
    """Trials with a start and an end, in seconds from the first start (the ledger's wall clock)."""
    rows = [t for t in data.trials if t.get("started_at") and t.get("ended_at")]
    if not rows:
        return []
    t0 = min(float(t["started_at"]) for t in rows)
    return [{**t, "t_start": float(t["started_at"]) - t0, "t_end": float(t["ended_at"]) - t0} for t in rows]


_STATUS_COLOR = {"completed": "C2", "stopped": "C1", "oom": "C3", "failed": "C3"}


def _plot_gantt(data: RunData, ax: Any) -> bool:
    """One bar per trial on its slot's row: when it ran, coloured by how it ended."""
    rows = _timeline(data)
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
    rows = sorted((t for t in _timeline(data) if t["stage"] == stage), key=lambda t: t["t_end"])
    xs, ys, cur = [], [], None
    for t in rows:
        v = _objective(t)
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


def curve_panels(data: RunData) -> list[str]:
    """The learning-curve panels the report draws: those some learning trial logs (a multi-agent job logs no team
    entropy or KL, so it gets no empty panel for them)."""
    learning = data.stage_trials("learning")
    return [title for title, prefixes in CURVES if any(_series(data, t["trial_id"], prefixes) for t in learning)]


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
                s = _series(data, t["trial_id"], prefixes)
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
                        and not _loads(t.get("overrides"), {})), None)
        ax = fig.subplots()
        drawn = False
        ends = {t["trial_id"]: _series(data, t["trial_id"], ("val-core/",)) for t in nodes}
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


# -- text ------------------------------------------------------------------------------------------------

def final_config(data: RunData) -> dict[str, Any]:
    """The final config as ``mart export`` writes it (``--set`` values, stage 1's and stage 2's best overrides) once
    the session finished; before that, the last finished stage's best config."""
    if data.summary.get("run_id"):
        from mart.graph.export import final_config as exported

        return exported(data.summary, data.options)
    for stage in ("learning", "system"):
        cfg = _loads((data.stages.get(stage) or {}).get("best_config"), None)
        if cfg:
            return cfg
    return {}


def as_overrides(config: dict[str, Any]) -> list[str]:
    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        if v is None:
            return "null"
        if isinstance(v, (list, dict)):
            return "'" + json.dumps(v) + "'"
        return str(v)

    return [f"{k}={fmt(v)}" for k, v in sorted(config.items())]


def as_yaml(config: dict[str, Any]) -> str:
    nested: dict[str, Any] = {}
    for key, value in sorted(config.items()):
        node = nested
        parts = key.split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):  # a key that is both a value and a prefix: keep it flat
                node = None
                break
            node = nxt
        if node is None:
            nested[key] = value
        else:
            node[parts[-1]] = value
    return yaml.safe_dump(nested, sort_keys=True, default_flow_style=False)


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "—"
        return f"{v:,.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _diff(t: dict[str, Any]) -> str:
    from mart.graph.figures import knob_text

    text = knob_text(_loads(t.get("overrides"), {}))
    if t.get("parent_trial"):  # a schedule branch: its changes against its parent, from whose checkpoint
        return f"{text or 'unchanged'} (from {t['parent_trial']} @ step {t.get('parent_step')})"
    return text or "(base)"


def headline(data: RunData) -> list[tuple[str, str]]:
    """One row per stage: the summary's figures when the session finished (the terminal's and ``--json``'s, through
    ``mart.graph.figures``), else the ledger's ``stage_results`` of the stages done so far (the same numbers)."""
    from mart.graph.figures import KEPT, stage_figures

    figures = {f.stage: f for f in stage_figures(data.summary)} if data.summary.get("run_id") else {}
    rows = []
    for stage, unit in (("system", "tok/s/GPU"), ("learning", "validation score"),
                        ("schedule", "validation score at the last step (static config → schedule)")):
        s = data.stages.get(stage)
        if not s:
            continue
        f = figures.get(stage)
        if f is not None:
            text = f"{f.baseline} → {f.best} {unit} ({f.gain})" + (f"; {f.hours_text()}" if f.hours else "")
        else:
            b, v = s.get("baseline_value"), s.get("best_value")
            gain = ""
            if s.get("best_trial") and s.get("best_trial") == s.get("baseline_trial"):
                gain = f" ({KEPT})"
            elif b is not None and v is not None and math.isfinite(b) and math.isfinite(v):
                relative = traits(stage).objective == "throughput" and b
                gain = f" ({(v / b - 1) * 100:+.1f}%)" if relative else f" ({v - b:+.4f})"
            text = f"{_fmt(b)} → {_fmt(v)} {unit}{gain}"
        rows.append((f"{stage} stage", f"{text}; best {s.get('best_trial') or '—'}"
                     + (f"; note: {s['note']}" if s.get("note") else "")))
    return rows


def trial_rows(data: RunData) -> list[list[str]]:
    out = []
    for t in data.trials:
        out.append([t["trial_id"], t["stage"], t["status"] + (f" ({t['reason']})" if t.get("reason") else ""),
                    _diff(t), _fmt(t["throughput"]), _fmt(t["peak_memory_gb"], 3), _fmt(t["score"], 3),
                    _fmt(t.get("steps_done"))])
    return out


TRIAL_HEADER = ["trial", "stage", "status", "change", "tok/s/GPU", "peak GB", "score", "steps"]
SCHEDULE_HEADER = ["steps", "changes at the segment's start", "overrides (against the base config)", "trial"]


def schedule_rows(data: RunData) -> list[list[str]]:
    """The winning schedule's segments (stage 3), from the summary."""
    from mart.graph.figures import knob_text as kv

    segs = ((data.summary or {}).get("schedule") or {}).get("segments") or []
    return [[f"{s['from_step']}-{s['to_step']}", kv(s.get("changes") or {}) or "unchanged",
             kv(s.get("overrides") or {}) or "(base)", s.get("trial_id") or ""] for s in segs]
REVIEW_HEADER = ["review", "candidate", "decision", "by", "channel", "feedback / edits"]


def review_rows(data: RunData) -> list[list[str]]:
    out = []
    for r in data.reviews:
        edits = _loads(r.get("edits"), {})
        words = r.get("feedback") or ", ".join(f"{k}={v}" for k, v in edits.items())
        out.append([r["review_id"], r.get("candidate_id") or "", r["action"], r.get("reviewer") or "",
                    r.get("channel") or "", words or ""])
    return out


# -- rendering -------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}img{max-width:100%;border:1px solid #eee}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em}.muted{color:#777}
"""


def _table_html(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img_html(path: Path, alt: str) -> str:
    b64 = base64.b64encode(path.read_bytes()).decode()
    return f'<p><img alt="{html_text(alt)}" src="data:image/png;base64,{b64}"></p>'


def render_html(data: RunData) -> str:
    cfg = final_config(data)
    figs = data.figures
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>mart run {html_text(data.run_id)}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>mart run {html_text(data.run_id)}</h1>",
             f"<p class='muted'>status: {html_text(data.status)} · backend: "
             f"{html_text(str(data.options.get('backend', '?')))} · {len(data.trials)} trials</p>"]
    if headline(data):
        parts.append(_table_html(["", "baseline → best"], [[a, b] for a, b in headline(data)]))
    sections = [("Best so far", "best_so_far"), ("Trials in parallel slots", "timeline"),
                ("Best so far against wall clock", "best_vs_time"), ("Phase breakdown of system trials", "phases"),
                ("Peak memory against the limit", "memory"), ("Predicted against measured", "calibration"),
                (f"Learning curves: {', '.join(curve_panels(data))} (dotted line: the health monitor stopped the "
                 "trial)", "learning_curves"),
                ("Schedule tree (stage 3)", "schedule_tree")]
    for title, key in sections:
        if key in figs:
            parts.append(f"<h2>{html_text(title)}</h2>" + _img_html(figs[key], title))
            if key == "best_so_far" and data.stage_trials("learning"):
                parts.append(f"<p class='muted'>{html_text(LEARNING_PLOT_RULE)}</p>")
    if schedule_rows(data):
        parts.append("<h2>Schedule (stage 3)</h2>" + _table_html(SCHEDULE_HEADER, schedule_rows(data)))
    parts.append("<h2>Trials</h2>" + _table_html(TRIAL_HEADER, trial_rows(data)))
    if data.health:
        parts.append("<h2>Health events</h2>" + _table_html(
            ["trial", "step", "rule", "severity", "message"],
            [[e["trial_id"], str(e["step"]), e["rule"], e["severity"], e["message"] or ""] for e in data.health]))
    parts.append("<h2>Reviews</h2>" + (_table_html(REVIEW_HEADER, review_rows(data)) if data.reviews
                                       else "<p class='muted'>no reviews</p>"))
    parts.append("<h2>Final config</h2>")
    if cfg:
        parts.append("<p>As verl overrides:</p><pre>" + html_text(" \\\n".join(as_overrides(cfg))) + "</pre>")
        parts.append("<p>As YAML:</p><pre>" + html_text(as_yaml(cfg)) + "</pre>")
    else:
        parts.append("<p class='muted'>no stage has finished yet</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _md_cell(text: str) -> str:
    return md_text(text)  # foreign text: no raw HTML, links, images or table breaks


def _table_md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(data: RunData) -> str:
    cfg = final_config(data)
    out = [f"# mart run {md_text(data.run_id)}", "",
           f"status: {md_text(data.status)} · backend: {md_text(data.options.get('backend', '?'))} · "
           f"{len(data.trials)} trials", ""]
    out += [f"- **{md_text(a)}**: {md_text(b)}" for a, b in headline(data)]
    for key, path in data.figures.items():
        out += ["", f"![{key}]({REPORT_DIR}/{path.name})"]  # mart's own names
        if key == "best_so_far" and data.stage_trials("learning"):
            out += ["", f"*{LEARNING_PLOT_RULE}*"]  # mart's own text
    if schedule_rows(data):
        out += ["", "## Schedule (stage 3)", "", _table_md(SCHEDULE_HEADER, schedule_rows(data))]
    out += ["", "## Trials", "", _table_md(TRIAL_HEADER, trial_rows(data))]
    if data.reviews:
        out += ["", "## Reviews", "", _table_md(REVIEW_HEADER, review_rows(data))]
    if cfg:
        # code blocks show their content as is: controls stripped, and a fence the content cannot close
        overrides, yaml_text = plain(" \\\n".join(as_overrides(cfg))), plain(as_yaml(cfg).rstrip())
        f1, f2 = md_fence(overrides), md_fence(yaml_text)
        out += ["", "## Final config", "", f1, overrides, f1, "", f2 + "yaml", yaml_text, f2]
    return "\n".join(out) + "\n"


def write_report(run_dir: str | Path, fmt: str = "html", out: str | Path | None = None) -> Path:
    """Write the report of the run in ``run_dir`` (PNGs into ``run_dir/report/``); returns the page's path."""
    if fmt not in ("html", "md"):
        raise ValueError(f"report format must be 'html' or 'md', got {fmt!r}")
    run_dir = Path(run_dir)
    data = load_run(run_dir)
    data.figures = draw_figures(data, run_dir / REPORT_DIR)
    path = Path(out) if out else run_dir / f"report.{fmt}"
    text = render_html(data) if fmt == "html" else render_markdown(data)
    return write_atomic(path.parent, path.name, text)  # a reader never sees half a page; no link followed
