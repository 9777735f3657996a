"""The figures of ``mart report`` and ``mart export``, read from a run's ledger: the trials, their metrics, the
best-so-far per stage, the headline, the tables' rows, the final config.

The ledger is opened read-only; every string from it is foreign text, escaped where it is shown
(``mart.graph.report``)."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mart.state.ledger import DB_FILE
from mart.state.stages import traits

CURVES = (  # (title, metric prefixes tried in order)
    ("reward", ("critic/score/mean", "critic/rewards/mean")),
    ("validation score", ("val-core/",)),
    ("entropy", ("actor/entropy",)),
    ("KL", ("actor/kl_loss", "actor/ppo_kl")),
    ("response length", ("response_length/mean",)),
    ("response clip ratio", ("response_length/clip_ratio",)),
)


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


def loads(text: str | None, default: Any) -> Any:
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
            options=loads(run.get("options"), {}),
            status=run.get("status") or "unknown",
            summary=loads(run.get("summary"), {}),
            trials=trials,
            metrics=metrics,
            reviews=rows("select * from reviews order by created_at"),
            proposals={p["candidate_id"]: p for p in rows("select * from proposals")},
            health=rows("select * from health_events order by trial_id, step"),
            stages={s["stage"]: s for s in rows("select * from stage_results")},
            profiles={p["stage"]: loads(p["profile"], {}) for p in rows("select * from profiles")},
        )
    finally:
        conn.close()


def series(data: RunData, trial_id: str, prefixes: tuple[str, ...]) -> list[tuple[int, float]]:
    keys = data.metrics.get(trial_id, {})
    for prefix in prefixes:
        for key in sorted(keys):
            if key.startswith(prefix):
                return [(s, v) for s, v in keys[key] if math.isfinite(v)]
    return []


def objective(trial: dict[str, Any]) -> float | None:
    v = trial["throughput"] if trial["stage"] == "system" else trial["score"]
    return v if v is not None and math.isfinite(v) else None


#: the rule the learning stage's best-so-far plot draws, said under it
LEARNING_PLOT_RULE = (
    "Learning stage: the points are single runs (hollow: never re-run) and the runs of configs re-run on a second "
    "seed (filled). Stage 2 never picks a config from one run: a change replaces the baseline only when its mean "
    "over two seeds beats the baseline's by more than 2 standard errors of the difference, with no collapse signal. "
    "The solid line is the change the stage took (its mean over its runs, from the trial its last run ended), drawn "
    "only when it took one; the dashed line is the baseline as the summary reports it.")


@dataclass
class LearningBest:
    """What the learning stage's best-so-far plot draws (x: the trial's number in the stage)."""

    xs: list[int]
    line: list[float]  # the mean of the change the stage's verdict took, from its last run on (NaN elsewhere)
    single: list[tuple[int, float]]  # runs of configs run once (unconfirmed)
    reran: list[tuple[int, float]]  # runs of configs run on two seeds
    taken: str | None = None  # the change the verdict took (None: the baseline was kept, or no verdict yet)


def learning_best(data: RunData) -> LearningBest:
    """Stage 2's plot by its own evidence rule: each run a point, and a line only for what the stage's verdict took
    (a re-run config the verdict did not take is points, never a "best" line above the baseline)."""
    trials = data.stage_trials("learning")
    runs: dict[str, list[tuple[int, float]]] = {}  # config (its first trial) -> [(x, score)] of healthy runs
    for i, t in enumerate(trials, 1):
        v = objective(t)
        if t["status"] == "completed" and v is not None and not t.get("early_stopped"):
            runs.setdefault(t.get("confirms") or t["trial_id"], []).append((i, v))
    confirmed = {k: r for k, r in runs.items() if len(r) >= 2}
    xs = list(range(1, len(trials) + 1))
    learn = data.summary.get("learning") or {} if data.summary.get("run_id") else {}
    row = data.stages.get("learning") or {}
    taken = row.get("best_trial") if learn and not learn.get("kept_baseline") else None
    line = [math.nan] * len(xs)
    if taken in runs and learn.get("best_score") is not None:
        since = max(i for i, _ in runs[taken])
        line = [learn["best_score"] if x >= since else math.nan for x in xs]
    else:
        taken = None
    return LearningBest(xs, line, [r[0] for k, r in runs.items() if k not in confirmed],
                        [p for r in confirmed.values() for p in r], taken)


@dataclass
class SystemBest:
    """What the system stage's best-so-far plot draws (x: the trial's number in the stage)."""

    xs: list[int]
    each: list[float]  # each trial's throughput over its window (NaN: none)
    best: list[float]  # the best eligible throughput so far
    baseline: float | None  # the baseline's figure as the summary compares it (a cut baseline: over its steps)
    baseline_x: int | None
    baseline_steps: list[int] | None  # the steps a cut baseline's figure is over (None: its usual window)


def system_best(data: RunData) -> SystemBest:
    """Stage 1's best so far, and its baseline as the verdict compared it: a baseline cut at its early look has no
    whole-window throughput, so its point and line are the summary's figure over the steps it ran."""
    trials = data.stage_trials("system")
    limit = data.memory_limit_gb()
    xs, best, ys, cur = [], [], [], None
    base_x, base_v = None, None
    for i, t in enumerate(trials, 1):
        v = objective(t)
        ok = t["status"] == "completed" and v is not None
        if ok and limit is not None and (t["peak_memory_gb"] or 0) > limit:
            ok = False  # over the margin never counts as best
        if ok:
            cur = v if cur is None else max(cur, v)
        if t.get("kind") == "baseline" and base_x is None:
            base_x, base_v = i, v
        xs.append(i)
        ys.append(math.nan if v is None else v)
        best.append(math.nan if cur is None else cur)
    sys_ = data.summary.get("system") or {}
    cmp_ = sys_.get("comparison") or {}
    steps = None
    if cmp_.get("baseline") is not None:
        base_v = cmp_["baseline"]
        steps = cmp_.get("steps") if sys_.get("baseline_cut") else None
    elif base_v is None and data.stages.get("system", {}).get("baseline_value") is not None:
        base_v = data.stages["system"]["baseline_value"]
    return SystemBest(xs, ys, best, base_v, base_x, steps)


def timeline(data: RunData) -> list[dict[str, Any]]:
    """Trials with a start and an end, in seconds from the first start (the ledger's wall clock)."""
    rows = [t for t in data.trials if t.get("started_at") and t.get("ended_at")]
    if not rows:
        return []
    t0 = min(float(t["started_at"]) for t in rows)
    return [{**t, "t_start": float(t["started_at"]) - t0, "t_end": float(t["ended_at"]) - t0} for t in rows]


def curve_panels(data: RunData) -> list[str]:
    """The learning-curve panels the report draws: those some learning trial logs (a multi-agent job logs no team
    entropy or KL, so it gets no empty panel for them)."""
    learning = data.stage_trials("learning")
    return [title for title, prefixes in CURVES if any(series(data, t["trial_id"], prefixes) for t in learning)]


def final_config(data: RunData) -> dict[str, Any]:
    """The final config as ``mart export`` writes it (``--set`` values, stage 1's and stage 2's best overrides) once
    the session finished; before that, the last finished stage's best config."""
    if data.summary.get("run_id"):
        from mart.graph.export import final_config as exported

        return exported(data.summary, data.options)
    for stage in ("learning", "system"):
        cfg = loads((data.stages.get(stage) or {}).get("best_config"), None)
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

    text = knob_text(loads(t.get("overrides"), {}))
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
            text = (f"{f.baseline} → {f.best} {unit} ({f.gain})" + (f"; {f.interval}" if f.interval else "")
                    + (f"; {f.hours_text()}" if f.hours else ""))
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
        verdict = stage_verdict(data.summary, stage) if f is not None else None
        if verdict:
            rows.append((f"{stage} verdict", verdict))
    return rows


def stage_verdict(summary: dict[str, Any], stage: str) -> str | None:
    """The numbers behind a stage's verdict, as the session decided it: stage 1's gain from the two figures it
    compares (and over which steps), stage 2's lead, bar, standard error and rule."""
    part = summary.get(stage) or {}
    if traits(stage).objective == "throughput":
        c = part.get("comparison") or {}
        if c.get("baseline") is None or c.get("best") is None or c.get("gain_pct") is None:
            return None
        from mart.state.units import fmt_steps

        where = f" over {fmt_steps(*c['steps'])}" if c.get("steps") else ""
        if c.get("measured") == "re-measured":
            rounds = (part.get("remeasure") or {}).get("rounds")
            sel = part.get("selecting_gain_pct")
            rule = (f"the means of the interleaved re-measurement ({rounds} round(s)), whose interval excludes zero"
                    + (f"; the selecting measurement read {sel:+.1f}% (it is biased up: it was picked for being "
                       "high)" if sel is not None else ""))
        elif (part.get("remeasure") or {}).get("trials"):
            rule = ("one measurement each, the selecting one; the best config is taken only when its gain, "
                    "re-measured interleaved with the baseline, has an interval that excludes zero")
        elif part.get("kept_baseline"):
            rule = "the baseline stayed the best"
        else:
            rule = "the highest throughput within the memory margin is taken"
        return f"gain {c['gain_pct']:+.1f}% = {c['best']:,.0f} / {c['baseline']:,.0f} - 1, both{where}; {rule}"
    return part.get("verdict")


def trial_origin(t: dict[str, Any], trials: list[dict[str, Any]]) -> str:
    """Where a trial comes from, as the terminal's launch line says it: the reviewed candidate it runs, or the trial
    it runs again (a confirmation on another seed, the baseline once more)."""
    if t.get("kind") == "confirm" and t.get("confirms"):
        return f"re-run of {t['confirms']}" + (f" on another seed ({t['seed']})" if t.get("seed") is not None else "")
    if t.get("kind") == "baseline":
        first = next((o["trial_id"] for o in trials if o["stage"] == t["stage"] and o.get("kind") == "baseline"), None)
        return f"re-run of {first}" if first and first != t["trial_id"] and t["stage"] != "schedule" else "baseline"
    return f"candidate {t['candidate_id']}" if t.get("candidate_id") else t.get("kind") or ""


def trial_rows(data: RunData) -> list[list[str]]:
    out = []
    for t in data.trials:
        out.append([t["trial_id"], trial_origin(t, data.trials), t["stage"],
                    t["status"] + (f" ({t['reason']})" if t.get("reason") else ""),
                    _diff(t), _fmt(t["throughput"]), _fmt(t["peak_memory_gb"], 3), _fmt(t["score"], 3),
                    _fmt(t.get("steps_done"))])
    return out


TRIAL_HEADER = ["trial", "from", "stage", "status", "change", "tok/s/GPU", "peak GB", "score", "steps"]
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
        edits = loads(r.get("edits"), {})
        words = r.get("feedback") or ", ".join(f"{k}={v}" for k, v in edits.items())
        out.append([r["review_id"], r.get("candidate_id") or "", r["action"], r.get("reviewer") or "",
                    r.get("channel") or "", words or ""])
    return out
