"""Benchmark mart against verl's defaults, random search, grid search, TPE and CMA-ES on the simulator.

For each scenario x seed, every method gets the same budget of stage-1 (system) and stage-2 (learning)
trials and the same horizons; the default config is each method's first trial of each stage (mart's
baseline counts in its budget). TPE and CMA-ES (Optuna) run twice: on the full catalogue and on the
focused space mart's agents search (``mart.trial_runner.verl.focus``). Every method's draws go through
the same repair and redraw budget (``bench.baselines.space``). Reported per method: every trial spent,
OOM / over-margin / failed trials, best throughput (measured and noise-free, % of the simulator's
optimum), the stage-2 choice's noise-free score against the defaults' (a regression when worse),
GPU-hours spent and saved by early termination.

    python bench/compare.py --quick                 # <= 10 min on 2 cores
    python bench/compare.py --quick --json          # ... and one JSON verdict object on stdout
    python bench/compare.py                         # 4 scenarios x 5 seeds
    python bench/compare.py --scenario-file job.yaml --perturb 7   # a user's scenario, a perturbed simulator
    python bench/compare.py --workload local        # the unsimulated check on the CPU workload
    python bench/compare.py --schedule --quick      # schedules vs static configs (bench/schedules.py)
    python bench/compare.py --parallel 4            # N trials at once, against wall clock (bench/parallel.py)

Writes ``bench/results/<timestamp>/{table.md, best_so_far.png, raw.json, verdict.json}`` and prints the
table (to stderr with ``--json``, so stdout holds only the verdict).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.baselines import Budget, MethodResult, TrialOutcome, run_method, run_trial

ALL_METHODS = ["mart", "default", "fit-largest", "random", "grid", "tpe", "tpe-restricted", "cmaes", "cmaes-restricted"]
SCENARIOS = ["qwen3-8b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-1x8", "qwen3-0.6b-2x8"]
QUICK_SCENARIOS = ["qwen3-0.6b-1x8", "qwen3-8b-1x8"]


# ---------------------------------------------------------------------------------------------- backends
# The sim integration points: a shipped scenario name or a user's scenario file, and the model-mismatch
# seed, both passed to the sim backend as options (``scenario_file=PATH``, ``perturb=SEED``).
def backend_options(workload: str, scenario: str, seed: int, scenario_file: str | None = None,
                    perturb: int | None = None, noise_scale: float | None = None) -> dict[str, Any]:
    """Options of the backend a run uses. The sim runs on its poll clock: one metric line per poll, so a
    trial's wall time does not depend on machine load and a health monitor can stop it at any step.
    ``noise_scale``: the sim's timing noise multiplier (``bench/noise.py``)."""
    if workload != "sim":
        return {}
    opts: dict[str, Any] = {"seed": seed, "clock": "poll"}
    opts.update({"scenario_file": scenario_file} if scenario_file else {"scenario": scenario})
    if perturb is not None:
        opts["perturb"] = perturb
    if noise_scale is not None:
        opts["noise_scale"] = noise_scale
    return opts


def make_backend(workload: str, scenario: str, seed: int, scenario_file: str | None = None, perturb: int | None = None):
    from mart.trial_runner.registry import load_backend

    return load_backend(workload, **backend_options(workload, scenario, seed, scenario_file, perturb))


def sim_scenario(scenario: str, scenario_file: str | None = None, perturb: int | None = None):
    """The simulator's scenario object: a shipped name or a user's YAML file (``sim.load_scenario``), with
    its hidden constants redrawn from ``perturb`` when given (the ground truth is the perturbed model's)."""
    from mart.trial_runner import sim

    if not hasattr(sim, "load_scenario"):
        if scenario_file or perturb is not None:
            raise SystemExit("--scenario-file/--perturb need mart.trial_runner.sim.load_scenario, which this build lacks")
        return sim.get_scenario(scenario)
    return sim.load_scenario(scenario_file or scenario, perturb)


def check_perturb_supported() -> None:
    import inspect

    from mart.trial_runner.sim.backend import SimBackend

    if "perturb" not in inspect.signature(SimBackend.__init__).parameters:
        raise SystemExit("--perturb needs the sim backend's `perturb` option (model mismatch), which this build lacks")


def local_available() -> bool:
    return importlib.util.find_spec("mart.trial_runner.local.backend") is not None


def mart_available() -> str | None:
    """None when mart's session API can run here, else why not."""
    for mod in ("mart.graph.session", "mart.state.ledger"):
        try:
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is missing"
        except ImportError as e:
            return f"{mod}: {e}"
    return None


# ---------------------------------------------------------------------------------------------- mart
def run_mart(task: dict[str, Any], budget: Budget, workdir: Path) -> MethodResult:
    """mart with the rules agents and auto-approval, through its session API; trials read from the ledger."""
    from mart.graph.session import TuneOptions, tune
    from mart.state.ledger import Ledger

    workload, scenario, seed = task["workload"], task["scenario"], task["seed"]
    where = (task.get("scenario_file"), task.get("perturb"))
    result = MethodResult(method="mart", scenario=scenario, seed=seed)
    t0 = time.monotonic()
    stages = {"stages": task["stages"]} if task.get("stages") else {}
    opts = TuneOptions(
        **stages, backend=workload, approve="auto", agents="rules",
        backend_options=backend_options(workload, scenario, seed, *where, noise_scale=task.get("noise_scale")),
        runs_dir=str(workdir), seed=seed, system_trials=budget.system_trials, learning_trials=budget.learning_trials,
        system_horizon=budget.system_horizon, learning_horizon=budget.learning_horizon,
        memory_margin=budget.memory_margin, quiet=True, watch_interval_s=0.01 if workload == "sim" else 0.5,
    )
    try:
        summary = tune(opts)
    except Exception as e:  # noqa: BLE001 - a failing mart run is reported in the table, not fatal
        result.error = f"{type(e).__name__}: {e}"
        result.extra["traceback"] = traceback.format_exc(limit=8)
        result.wall_s = time.monotonic() - t0
        return result
    result.extra["summary"] = summary
    run_dir = Path(summary.get("run_dir") or Path(workdir) / summary["run_id"])
    backend = make_backend(workload, scenario, seed, *where)
    capacity = backend.memory_capacity_gb()
    limit = None if capacity is None else (1 - budget.memory_margin) * capacity
    ledger = Ledger.open(run_dir)
    try:
        rows = ledger.trials()
    finally:
        ledger.close()
    usage_by_dir = _sim_usage_index(run_dir)
    for row in sorted(rows, key=lambda r: (r.get("stage") != "system", r.get("seq") or 0)):
        stage = row.get("stage")
        status = str(row.get("status"))
        usage = usage_by_dir.get(row.get("trial_id"), {})
        wall = float(row.get("wall_s") or 0.0)
        out = TrialOutcome(
            stage=stage, seq=int(row.get("seq") or 0), overrides=row.get("overrides") or {}, status=status,
            throughput=_num(row.get("throughput")), peak_memory_gb=_num(row.get("peak_memory_gb")),
            score=_num(row.get("score")), early_stopped=bool(row.get("early_stopped")),
            gpu_hours=float(usage.get("gpu_hours", wall / 3600.0)),
            planned_gpu_hours=float(usage.get("planned_gpu_hours", wall / 3600.0)),
            steps_done=int(row.get("steps_done") or 0), reason=row.get("reason"),
            rerun=row.get("kind") == "confirm", trial_id=row.get("trial_id"),
        )
        if stage == "system":
            out.feasible = (status == "completed" and out.throughput is not None
                            and (limit is None or out.peak_memory_gb is None or out.peak_memory_gb <= limit))
        else:
            out.feasible = status == "completed" and out.score is not None
        result.trials.append(out)
    sysd, learn = summary.get("system") or {}, summary.get("learning") or {}
    result.best_throughput = _num(sysd.get("best_throughput"))
    result.best_system = sysd.get("best_config") or {}
    result.best_score = _num(learn.get("best_score"))
    result.best_learning = learn.get("best_config") or {}
    result.wall_s = time.monotonic() - t0
    return result


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _sim_usage_index(run_dir: Path) -> dict[str, dict[str, Any]]:
    """trial_id -> the sim's GPU-hour accounting, from every simulated trial directory under ``run_dir``."""
    out = {}
    for meta in run_dir.rglob("sim_trial.json"):
        try:
            trial_id = json.loads(meta.read_text())["spec"]["trial_id"]
            out[trial_id] = json.loads((meta.parent / "sim_state.json").read_text())
        except (OSError, KeyError, json.JSONDecodeError):
            continue
    return out


# ---------------------------------------------------------------------------------------------- one task
def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """One (workload, scenario, seed, method) run in a worker process; returns a JSON-able dict."""
    budget = Budget(**task["budget"])
    workdir = Path(tempfile.mkdtemp(prefix=f"mart-bench-{task['method']}-", dir=task.get("tmp")))
    where = (task.get("scenario_file"), task.get("perturb"))
    t0 = time.monotonic()
    load0 = _loadavg()
    try:
        if task["method"] == "mart":
            res = run_mart(task, budget, workdir)
        else:
            backend = make_backend(task["workload"], task["scenario"], task["seed"], *where)
            res = run_method(task["method"], backend, scenario=task["scenario"], seed=task["seed"], budget=budget,
                             workdir=workdir)
    except Exception as e:  # noqa: BLE001 - one failing run must not lose the others
        res = MethodResult(method=task["method"], scenario=task["scenario"], seed=task["seed"],
                           error=f"{type(e).__name__}: {e}", extra={"traceback": traceback.format_exc(limit=8)})
    res.wall_s = res.wall_s or time.monotonic() - t0
    res.extra["loadavg"] = [load0, _loadavg()]
    if task.get("remeasure") and not res.error:
        res.extra["remeasured"] = remeasure(task, res, budget, workdir / "remeasure")
        res.extra["loadavg"].append(_loadavg())
    d = res.to_dict()
    d["workload"] = task["workload"]
    d["scenario_file"] = task.get("scenario_file")
    if task["workload"] == "sim":
        d["noise_free"] = _noise_free_scores(task, res, budget)
    if not task.get("keep"):
        _rmtree(workdir)
    return d


def _loadavg() -> float | None:
    """The 1-minute load average (None where the OS has none): CPU-workload timings are read beside it."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def remeasure(task: dict[str, Any], res: MethodResult, budget: Budget, workdir: Path) -> list[float | None]:
    """Throughput of the method's chosen system config measured ``task['remeasure']`` more times (the
    spread says how much of a difference between methods is measurement noise)."""
    backend = make_backend(task["workload"], task["scenario"], task["seed"], task.get("scenario_file"), task.get("perturb"))
    base = dict(backend.base_config())
    capacity = backend.memory_capacity_gb()
    limit = None if capacity is None else (1 - budget.memory_margin) * capacity
    runner = backend.make_runner()
    out: list[float | None] = []
    try:
        for k in range(int(task["remeasure"])):
            t = run_trial(backend, runner, trial_id=f"remeasure-{k + 1}", stage="system", seq=k + 1, base=base,
                          overrides=res.best_system, steps=budget.system_horizon, workdir=workdir, seed=task["seed"],
                          limit_gb=limit, poll_sleep_s=budget.poll_sleep_s)
            out.append(t.throughput if t.status == "completed" else None)
    finally:
        runner.close()
    return out


def _noise_free_scores(task: dict[str, Any], res: MethodResult, budget: Budget) -> dict[str, Any]:
    """The simulator's noise-free value of the configs a method chose (what it would really get), and of
    the default learning knobs on the same system config (a stage-2 choice below it is a regression)."""
    from mart.trial_runner.sim import model

    # the team's expected score on a multi-agent scenario, the policy's on a single-agent one
    final_score_noise_free = getattr(model, "expected_score", None)
    if final_score_noise_free is None:
        from mart.trial_runner.sim.learning import final_score_noise_free
    sc = sim_scenario(task["scenario"], task.get("scenario_file"), task.get("perturb"))
    base = model.base_config(sc)
    system = {**base, **res.best_system}
    thr, peak = model.expected_throughput(system, sc, budget.system_horizon)
    score = final_score_noise_free({**system, **res.best_learning}, sc, budget.learning_horizon)
    default = final_score_noise_free(system, sc, budget.learning_horizon)
    return {"throughput": thr, "peak_memory_gb": peak, "score": score, "default_score": default}


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- metrics
#: a stage-2 choice this much below the defaults' noise-free score counts as a regression
REGRESSION_EPS = 1e-4


def over_margin(t: dict[str, Any], limit_gb: float | None) -> bool:
    """A stage-1 trial over the memory margin: completed above the limit, or stopped for it (mart's health
    monitor stops such trials: status ``stopped``, reason naming the ``memory_margin`` rule)."""
    if t["stage"] != "system" or t["status"] == "oom":
        return False
    if t["status"] == "stopped" and "memory_margin" in str(t.get("reason") or ""):
        return True
    if limit_gb is not None and t.get("peak_memory_gb") is not None and t["peak_memory_gb"] > limit_gb:
        return True
    return t["status"] == "completed" and t["throughput"] is not None and not t["feasible"]


def summarize(run: dict[str, Any], optimum: float | None, budget: Budget, limit_gb: float | None = None) -> dict[str, Any]:
    """The table's figures for one run. Every trial spent is counted once in ``trials`` and, when it did not
    complete within the margin, in exactly one of ``oom``, ``over_margin``, ``failed``, ``stopped``."""
    sys_trials = [t for t in run["trials"] if t["stage"] == "system"]
    learn = [t for t in run["trials"] if t["stage"] == "learning"]
    curve, best, gpu_curve, spent_sys = [], None, [], 0.0
    for t in sys_trials:
        spent_sys += float(t.get("gpu_hours") or 0.0)
        if t.get("rerun"):  # mart's re-measurement or repeat: GPU-hours spent, no new config found
            gpu_curve.append((spent_sys, best))
            continue
        if t["feasible"] and t["throughput"] is not None:
            best = t["throughput"] if best is None else max(best, t["throughput"])
        curve.append(best)
        gpu_curve.append((spent_sys, best))
    best_thr = max((t["throughput"] for t in sys_trials if t["feasible"] and t["throughput"] is not None
                    and not t.get("rerun")), default=None)
    to95 = None
    if optimum:
        for i, b in enumerate(curve, start=1):
            if b is not None and b >= 0.95 * optimum:
                to95 = i
                break
    scores = [t["score"] for t in learn if t["feasible"] and t["score"] is not None]
    spent = sum(t["gpu_hours"] for t in run["trials"])
    saved = sum(max(0.0, t["planned_gpu_hours"] - t["gpu_hours"]) for t in run["trials"] if t["early_stopped"])
    nf = run.get("noise_free") or {}
    margin = [over_margin(t, limit_gb) for t in run["trials"]]
    chosen, default = nf.get("score"), nf.get("default_score")
    remeasured = [v for v in (run.get("extra") or {}).get("remeasured") or [] if v is not None]
    return {
        "best_throughput": best_thr,
        "pct_of_optimum": None if (best_thr is None or not optimum) else 100 * best_thr / optimum,
        "trials_to_95": to95,
        "trials": len(run["trials"]),
        "oom": sum(t["status"] == "oom" for t in run["trials"]),
        "over_margin": sum(margin),
        "failed": sum(t["status"] == "failed" for t in run["trials"]),
        "stopped": sum(t["status"] == "stopped" and not m for t, m in zip(run["trials"], margin)),
        "learning_score": max(scores) if scores else None,
        "learning_score_noise_free": chosen,
        "learning_default_noise_free": default,
        "stage2_regression": None if chosen is None or default is None else chosen < default - REGRESSION_EPS,
        "chosen_pct_noise_free": None if not (optimum and nf.get("throughput")) else 100 * nf["throughput"] / optimum,
        "no_valid_candidate": (run.get("extra") or {}).get("no_valid_candidate") or {},
        "remeasured": remeasured,
        "gpu_hours": spent,
        "gpu_hours_saved": saved,
        "early_stopped": sum(bool(t["early_stopped"]) for t in run["trials"]),
        "system_trials": len(sys_trials),
        "learning_trials": len(learn),
        "curve": [None if (b is None or not optimum) else 100 * b / optimum for b in curve],
        "gpu_curve": gpu_curve,
        "probes": sum(bool(t.get("probe")) for t in sys_trials),
        "error": run.get("error"),
        "wall_s": run.get("wall_s"),
    }


def best_within(gpu_curve: list[tuple[float, float | None]], gpu_hours: float) -> float | None:
    """The best feasible stage-1 throughput a method had measured once it had spent ``gpu_hours`` (a trial
    counts when it has finished)."""
    best = None
    for spent, b in gpu_curve:
        if spent > gpu_hours * (1 + 1e-9):
            break
        best = b
    return best


def equal_gpu_pairs(sc_rep: dict[str, Any], ref: str = "mart") -> dict[str, dict[str, Any]]:
    """Per baseline: in how many seeds ``ref``'s best measured stage-1 throughput is >= the baseline's at equal
    stage-1 GPU-hours (both read at the smaller of the two spends)."""
    rows = {r["seed"]: r for r in sc_rep["methods"].get(ref, [])}
    out: dict[str, dict[str, Any]] = {}
    for method, others in sc_rep["methods"].items():
        if method == ref:
            continue
        wins, n, gaps, lost = 0, 0, [], []
        for o in others:
            m = rows.get(o["seed"])
            if m is None or not m.get("gpu_curve") or not o.get("gpu_curve"):
                continue
            g = min(m["gpu_curve"][-1][0], o["gpu_curve"][-1][0])
            a, b = best_within(m["gpu_curve"], g), best_within(o["gpu_curve"], g)
            n += 1
            if b is None or (a is not None and a >= b):
                wins += 1
            else:
                lost.append(o["seed"])
            if a is not None and b:
                gaps.append(100 * (a / b - 1))
        out[method] = {"pairs": n, "ref_at_least": wins, "median_gain_pct": statistics.median(gaps) if gaps else None,
                       "lost_seeds": sorted(lost)}
    return out


def at_least_every_baseline(sc_rep: dict[str, Any], ref: str = "mart",
                            pairs: dict[str, dict[str, Any]] | None = None) -> dict[int, bool]:
    """Per seed: whether ``ref`` is at least every other method at equal stage-1 GPU-hours (the issue's pair);
    ``pairs``: ``equal_gpu_pairs(sc_rep, ref)`` when the caller has it already."""
    pairs = equal_gpu_pairs(sc_rep, ref) if pairs is None else pairs
    lost = {s for p in pairs.values() for s in p["lost_seeds"]}
    return {r["seed"]: r["seed"] not in lost for r in sc_rep["methods"].get(ref, [])}


def _fmt(vals: list[float | None], fmt: str, missing: str = "—", pct: bool = False) -> str:
    xs = [v for v in vals if v is not None]
    if not xs:
        return missing
    med = statistics.median(xs)
    s = fmt.format(med)
    if len(xs) > 1 and min(xs) != max(xs):
        s += f" [{fmt.format(min(xs))}–{fmt.format(max(xs))}]"
    if len(xs) < len(vals):
        s += f" ({len(vals) - len(xs)}×{missing})"
    return s


def _fmt_to95(vals: list[int | None], n: int) -> str:
    reached = [v for v in vals if v is not None]
    if not reached:
        return f"never (0/{len(vals)})"
    s = f"{statistics.median(reached):g}"
    if len(reached) > 1 and min(reached) != max(reached):
        s += f" [{min(reached)}–{max(reached)}]"
    return s + f" ({len(reached)}/{len(vals)} reached)"


def _fmt_count(rows: list[dict[str, Any]], key: str) -> str:
    vals = [r[key] for r in rows]
    return f"{sum(vals)} ({_fmt(vals, '{:g}')})" if any(vals) else "0"


def _fmt_regressions(rows: list[dict[str, Any]]) -> str:
    known = [r["stage2_regression"] for r in rows if r["stage2_regression"] is not None]
    return f"{sum(known)}/{len(known)}" if known else "—"


def _fmt_no_valid(rows: list[dict[str, Any]]) -> str:
    hits = [f"{st} trial {i}" for r in rows for st, i in sorted(r["no_valid_candidate"].items())]
    if not hits:
        return "—"
    return f"**{len(hits)} stage(s) in {sum(bool(r['no_valid_candidate']) for r in rows)}/{len(rows)} runs** " \
           f"(e.g. {hits[0]})"


def _spread_pct(vals: list[float]) -> float | None:
    return None if len(vals) < 2 else 100 * (max(vals) - min(vals)) / statistics.median(vals)


def render_local_noise(sc_rep: dict[str, Any], runs: list[dict[str, Any]], scenario: str) -> list[str]:
    """Measurement noise on the CPU workload next to the differences the table ranks."""
    lines = []
    by_seed: dict[int, list[float]] = {}
    for r in runs:
        t1 = next((t for t in r["trials"] if r["scenario"] == scenario and t["stage"] == "system" and t["seq"] == 1
                   and t["status"] == "completed" and t["throughput"] is not None), None)
        if t1 is not None:
            by_seed.setdefault(r["seed"], []).append(t1["throughput"])
    loads = [x for r in runs if r["scenario"] == scenario for x in (r.get("extra") or {}).get("loadavg") or []
             if x is not None]
    if loads:
        lines.append(f"- Load average (1 min) at the start and end of each run and re-measurement: median "
                     f"{statistics.median(loads):.2f} [{min(loads):.2f}–{max(loads):.2f}] on {os.cpu_count()} cores.")
    spreads = [x for x in (_spread_pct(v) for v in by_seed.values()) if x is not None]
    if spreads:
        lines.append(f"- The defaults, measured once per method (same config, same seed): spread (max−min)/median "
                     f"{statistics.median(spreads):.1f}% (median over seeds; max {max(spreads):.1f}%).")
    win = [x for rows in sc_rep["methods"].values() for r in rows
           if (x := _spread_pct([v for v in [r["best_throughput"], *r["remeasured"]] if v is not None])) is not None]
    if win:
        lines.append(f"- Each winner re-measured: spread {statistics.median(win):.1f}% (median; max {max(win):.1f}%).")
    methods = sc_rep["methods"]
    if "mart" in methods and any(m in methods for m in ("random", "tpe")):
        # mart's winner re-measured against the better of random's and TPE's, seed by seed (equal trials)
        def remeasured(m: str, seed: int) -> float | None:
            row = next((r for r in methods.get(m, []) if r["seed"] == seed), None)
            return statistics.median(row["remeasured"]) if row and row["remeasured"] else None
        wins, n = 0, 0
        for r in methods["mart"]:
            mine = remeasured("mart", r["seed"])
            others = [x for x in (remeasured("random", r["seed"]), remeasured("tpe", r["seed"])) if x is not None]
            if mine is None or not others:
                continue
            n += 1
            wins += mine >= max(others)
        if n:
            lines.append(f"- mart's re-measured winner ≥ the better of random's and TPE's re-measured winners in "
                         f"{wins} of {n} seeds.")
    bests = [statistics.median(xs) for rows in sc_rep["methods"].values()
             if (xs := [r["best_throughput"] for r in rows if r["best_throughput"] is not None])]
    if len(bests) > 1:
        lines.append(f"- Differences ranked: methods' median best throughputs span "
                     f"{100 * (max(bests) - min(bests)) / statistics.median(bests):.1f}%; a gap below the spreads "
                     f"above is noise.")
    return lines


def render_table(report: dict[str, Any]) -> str:
    lines = [f"# mart vs baselines ({report['workload']})", ""]
    b = report["budget"]
    lines.append(f"Budget per method: {b['system_trials']} stage-1 trials x {b['system_horizon']} steps, "
                 f"{b['learning_trials']} stage-2 trials x {b['learning_horizon']} steps, memory margin "
                 f"{b['memory_margin']:.0%}; seeds {report['seeds']}. Cells: median [min–max] over seeds; counts: "
                 f"total (per-seed median [min–max]).")
    if report.get("perturb") is not None:
        lines.append(f"Simulator perturbed (model mismatch) with seed {report['perturb']}.")
    lines.append("")
    if report["workload"] != "sim":
        lines.append("Measured on the real workload: no noise-free values, no optimum; trials run one at a time and "
                     "each winner is re-measured (the spreads under each table say what a difference is worth).")
        lines.append("")
    lines.append("Measured values carry the simulator's noise (the best of several noisy trials is biased upward); "
                 "the noise-free columns re-evaluate the config each method chose without noise (learning: the "
                 "expected score over the collapse draw). Stage 2 picks by the measured score; a pick whose "
                 "noise-free score is below the defaults' (same system config) is a regression. GPU-hours are "
                 "simulated (trial time x GPUs), both stages. `-restricted` = the focused space mart's agents "
                 "search; a method that could not draw a valid candidate within the shared redraw budget says so "
                 "(its stage stops; it does not rerun the defaults).")
    lines.append("")
    for sc, sc_rep in report["scenarios"].items():
        gt = sc_rep.get("ground_truth") or {}
        lines.append(f"## {sc}")
        if gt:
            lines.append(
                f"Simulator optimum (exhaustive, {gt['evaluated']:,} grid points): {gt['throughput']:.0f} tok/s/GPU "
                f"(peak {gt['peak_memory_gb']:.1f} GB of {gt['limit_gb']:.1f} allowed); verl defaults "
                f"{gt['baseline_throughput']:.0f} → optimum is **+{gt['gain_pct']:.1f}%**. "
                f"Best learning score on its grid: {sc_rep['ground_truth_learning']['score']:.4f} "
                f"(defaults {sc_rep['ground_truth_learning']['baseline_score']:.4f}).")
            lines.append(f"Optimum's config: `{json.dumps(optimum_config(gt), sort_keys=True)}`")
        else:
            lines.append("No ground truth on this workload: % of optimum is relative to the best throughput any "
                         "method found for the same seed.")
        lines.append("")
        local = report["workload"] != "sim"
        head = ("| method | trials | OOM | over-margin | failed | stopped | best throughput (tok/s/GPU) | % of optimum | "
                "chosen config, noise-free % | trials to 95% | stage-2 score (measured) | stage-2 pick, noise-free | "
                "stage-2 defaults, noise-free | stage-2 regressions | GPU-h spent | GPU-h saved (early stop) | "
                "no valid candidate |")
        if local:
            head += " winner re-measured |"
        lines.append(head)
        lines.append("|" + "---|" * (head.count("|") - 1))
        for method, rows in sc_rep["methods"].items():
            errs = [r["error"] for r in rows if r.get("error")]
            name = method + (" ⚠" if errs else "") + (" ✗" if any(r["no_valid_candidate"] for r in rows) else "")
            row = (f"| {name} | {_fmt_count(rows, 'trials')} | {_fmt_count(rows, 'oom')} "
                   f"| {_fmt_count(rows, 'over_margin')} | {_fmt_count(rows, 'failed')} | {_fmt_count(rows, 'stopped')} "
                   f"| {_fmt([r['best_throughput'] for r in rows], '{:.0f}')} "
                   f"| {_fmt([r['pct_of_optimum'] for r in rows], '{:.1f}')} "
                   f"| {_fmt([r['chosen_pct_noise_free'] for r in rows], '{:.1f}')} "
                   f"| {_fmt_to95([r['trials_to_95'] for r in rows], b['system_trials'])} "
                   f"| {_fmt([r['learning_score'] for r in rows], '{:.4f}')} "
                   f"| {_fmt([r['learning_score_noise_free'] for r in rows], '{:.4f}')} "
                   f"| {_fmt([r['learning_default_noise_free'] for r in rows], '{:.4f}')} "
                   f"| {_fmt_regressions(rows)} "
                   f"| {_fmt([r['gpu_hours'] for r in rows], '{:.0f}')} "
                   f"| {_fmt([r['gpu_hours_saved'] for r in rows], '{:.0f}')} | {_fmt_no_valid(rows)} |")
            if local:
                row += f" {_fmt([statistics.median(r['remeasured']) if r['remeasured'] else None for r in rows], '{:.0f}')} |"
            lines.append(row)
        pairs = equal_gpu_pairs(sc_rep) if "mart" in sc_rep["methods"] else {}
        if any(v["pairs"] for v in pairs.values()):
            lines.append("")
            lines.append("At equal stage-1 GPU-hours (each pair read at the smaller spend): mart's best measured "
                         "throughput ≥ the method's in " + ", ".join(
                             f"{m} {v['ref_at_least']}/{v['pairs']}"
                             + (f" ({v['median_gain_pct']:+.1f}% median)" if v["median_gain_pct"] is not None else "")
                             for m, v in pairs.items() if v["pairs"]) + " seeds.")
            every = at_least_every_baseline(sc_rep, pairs=pairs)
            lines.append(f"mart ≥ every other method at once: {sum(every.values())}/{len(every)} seeds.")
        if local:
            lines.append("")
            lines += render_local_noise(sc_rep, report["runs"], sc)
        errors = [(m, r["error"]) for m, rows in sc_rep["methods"].items() for r in rows if r.get("error")]
        if errors:
            lines.append("")
            for m, e in errors[:6]:
                lines.append(f"- ⚠ {m}: {e}")
        lines.append("")
    return "\n".join(lines)


def optimum_config(gt: dict[str, Any]) -> dict[str, Any]:
    """The optimum's config as the ground truth reports it (its overrides of the scenario's base config)."""
    return gt.get("overrides") or {}


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """The machine-readable verdict (``--json``): per scenario the optimum, per run the figures."""
    scenarios = {}
    for sc, sc_rep in report["scenarios"].items():
        gt = sc_rep.get("ground_truth") or {}
        scenarios[sc] = {"optimum": gt.get("throughput"), "optimum_config": optimum_config(gt),
                         "mart_vs_at_equal_gpu_hours": equal_gpu_pairs(sc_rep) if "mart" in sc_rep["methods"] else {}}
    runs = []
    for sc, sc_rep in report["scenarios"].items():
        pairs = scenarios[sc]["mart_vs_at_equal_gpu_hours"]
        every = at_least_every_baseline(sc_rep, pairs=pairs) if "mart" in sc_rep["methods"] else {}
        for method, rows in sc_rep["methods"].items():
            for r in rows:
                extra = {"at_least_every_baseline": every.get(r["seed"])} if method == "mart" else {}
                runs.append({**extra,
                    "scenario": sc, "seed": r["seed"], "method": method,
                    "best_so_far_pct": r["curve"],
                    "stage1_gpu_hours": r["gpu_curve"][-1][0] if r["gpu_curve"] else 0.0, "probes": r["probes"],
                    "chosen_noise_free_pct": r["chosen_pct_noise_free"],
                    "trials": r["trials"], "oom": r["oom"], "over_margin": r["over_margin"], "failed": r["failed"],
                    "stage2_chosen_noise_free": r["learning_score_noise_free"],
                    "stage2_default_noise_free": r["learning_default_noise_free"],
                    "no_valid_candidate": r["no_valid_candidate"], "error": r["error"],
                })
    return {"scenarios": scenarios, "runs": runs}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scs = list(report["scenarios"])
    fig, axes = plt.subplots(1, len(scs), figsize=(5 * len(scs), 4), squeeze=False)
    for ax, sc in zip(axes[0], scs):
        for method, rows in report["scenarios"][sc]["methods"].items():
            curves = [r["curve"] for r in rows if r["curve"]]
            if not curves:
                continue
            n = max(len(c) for c in curves)
            xs, med, lo, hi = [], [], [], []
            for i in range(n):
                vals = [c[min(i, len(c) - 1)] for c in curves]
                vals = [v for v in vals if v is not None]
                if not vals:
                    continue
                xs.append(i + 1)
                med.append(statistics.median(vals))
                lo.append(min(vals))
                hi.append(max(vals))
            if xs:
                line = ax.plot(xs, med, marker="o", ms=3, label=method)[0]
                ax.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
        ax.axhline(100, color="k", lw=0.8, ls="--")
        ax.axhline(95, color="k", lw=0.5, ls=":")
        ax.set_title(sc)
        ax.set_xlabel("stage-1 trials")
        ax.set_ylabel("best-so-far throughput (% of optimum)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 scenarios x 3 seeds, smaller budgets (<= 10 min on 2 cores)")
    p.add_argument("--workload", choices=["sim", "local"], default="sim", help="simulator (default) or the CPU workload")
    p.add_argument("--schedule", action="store_true",
                   help="stage 3's comparison instead: schedules vs static configs (options: bench/schedules.py --help)")
    p.add_argument("--parallel", type=int, nargs="+", metavar="N",
                   help="stage 1 with N trials at once for every method, against wall clock (bench/parallel.py --help)")
    p.add_argument("--scenarios", nargs="+", default=None, help=f"shipped sim scenarios (default: all {len(SCENARIOS)})")
    p.add_argument("--scenario", action="append", default=[], metavar="NAME",
                   help="a shipped sim scenario, repeatable (adds to --scenarios), e.g. the multi-agent "
                        "qwen2.5-3b-debate-2x2 (docs/sim.md, \"Multi-agent scenarios\")")
    p.add_argument("--scenario-file", action="append", default=[], metavar="FILE",
                   help="a scenario YAML file describing your job (repeatable; replaces the default scenarios "
                        "unless --scenarios is also given)")
    p.add_argument("--perturb", type=int, default=None, metavar="SEED",
                   help="perturb the simulator's hidden constants with this seed (model mismatch)")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5; quick 3; local 3)")
    p.add_argument("--methods", default=",".join(ALL_METHODS), help="comma-separated subset of " + ",".join(ALL_METHODS))
    p.add_argument("--system-trials", type=int, default=None)
    p.add_argument("--learning-trials", type=int, default=None)
    p.add_argument("--system-horizon", type=int, default=6)
    p.add_argument("--learning-horizon", type=int, default=None)
    p.add_argument("--memory-margin", type=float, default=0.1)
    p.add_argument("--remeasure", type=int, default=None,
                   help="re-measure each method's winner this many times (default: 2 on local, 0 on sim)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="worker processes (sim only: the local workload runs one measurement at a time)")
    p.add_argument("--json", action="store_true", help="print one JSON verdict object on stdout (table to stderr)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results root folder")
    p.add_argument("--keep", action="store_true", help="keep the runs' trial directories")
    return p.parse_args(argv)


def build_plan(args: argparse.Namespace) -> tuple[Budget, list[str], list[int], list[str]]:
    local = args.workload == "local"
    if local:
        n1, n2, h2, seeds, scs = 4, 2, 8, 3, ["local"]
    elif args.quick:
        n1, n2, h2, seeds, scs = 10, 4, 20, 3, QUICK_SCENARIOS
    else:
        n1, n2, h2, seeds, scs = 12, 6, 30, 5, SCENARIOS
    budget = Budget(
        system_trials=args.system_trials or n1,
        learning_trials=args.learning_trials if args.learning_trials is not None else n2,
        system_horizon=args.system_horizon,
        learning_horizon=args.learning_horizon or h2,
        memory_margin=args.memory_margin,
        poll_sleep_s=0.1 if local else 0.0,
    )
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown method(s) {unknown}: choose from {ALL_METHODS}")
    if local and (args.scenario_file or args.perturb is not None):
        raise SystemExit("--scenario-file and --perturb describe the simulator: use them with --workload sim")
    named = list(args.scenarios or []) + [sc for sc in args.scenario if sc not in (args.scenarios or [])]
    scenarios = named or ([] if args.scenario_file else scs)
    return budget, scenarios, list(range(args.seeds or seeds)), methods


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--schedule" in argv:  # stage 3's comparison (schedules vs static configs): bench/schedules.py
        from bench.schedules import main as schedules_main

        return schedules_main([a for a in argv if a != "--schedule"])
    if "--parallel" in argv:  # stage 1 with N trials at once, against wall clock: bench/parallel.py
        from bench.parallel import main as parallel_main

        return parallel_main(argv)
    args = parse_args(argv)
    budget, scenarios, seeds, methods = build_plan(args)
    log = sys.stderr if args.json else sys.stdout
    if args.workload == "local" and not local_available():
        raise SystemExit("--workload local needs mart.trial_runner.local.backend (the CPU workload), which is missing")
    if args.perturb is not None:
        check_perturb_supported()
    if "mart" in methods:
        why = mart_available()
        if why:
            print(f"[compare] skipping mart: {why}", file=sys.stderr)
            methods = [m for m in methods if m != "mart"]
    local = args.workload == "local"
    jobs = 1 if local else args.jobs  # no two CPU-workload measurements share the cores
    if local and args.jobs > 1:
        print("[compare] --workload local runs one trial at a time (--jobs ignored)", file=sys.stderr)
    remeasure_n = args.remeasure if args.remeasure is not None else (2 if local else 0)
    # scenario name -> its file (None for shipped scenarios)
    files: dict[str, str | None] = {sc: None for sc in scenarios}
    for f in args.scenario_file:
        name = sim_scenario("", f).name
        if name in files:
            raise SystemExit(f"--scenario-file {f}: scenario name {name!r} is already used; names must be unique")
        files[name] = str(Path(f).resolve())
    t0 = time.monotonic()
    print(f"[compare] load average at the start: {os.getloadavg() if hasattr(os, 'getloadavg') else 'n/a'}",
          file=sys.stderr)
    report: dict[str, Any] = {"workload": args.workload, "budget": asdict(budget), "seeds": seeds, "methods": methods,
                              "perturb": args.perturb, "scenario_files": {k: v for k, v in files.items() if v},
                              "scenarios": {}, "runs": []}
    optimum: dict[str, float | None] = {}
    limits: dict[str, float | None] = {}
    for sc, path in files.items():
        report["scenarios"][sc] = {"methods": {m: [] for m in methods}}
        if args.workload == "sim":
            gt, gtl = sim_ground_truths(sc, path, budget, args.perturb)
            report["scenarios"][sc]["ground_truth"] = gt
            report["scenarios"][sc]["ground_truth_learning"] = gtl
            optimum[sc], limits[sc] = gt["throughput"], gt["limit_gb"]
        else:
            cap = make_backend(args.workload, sc, 0).memory_capacity_gb()
            limits[sc] = None if cap is None else (1 - budget.memory_margin) * cap
    tasks = [{"workload": args.workload, "scenario": sc, "scenario_file": path, "perturb": args.perturb, "seed": s,
              "method": m, "budget": asdict(budget), "keep": args.keep, "remeasure": remeasure_n}
             for sc, path in files.items() for s in seeds for m in methods]
    # the slowest (mart) first, so the pool stays busy
    tasks.sort(key=lambda t: t["method"] != "mart")
    runs: list[dict[str, Any]] = []

    def done(t: dict[str, Any], run: dict[str, Any]) -> None:
        runs.append(run)
        err = f" ERROR {run['error']}" if run.get("error") else ""
        print(f"[compare] {t['scenario']} seed {t['seed']} {t['method']}: {len(run['trials'])} trials, "
              f"{run['wall_s']:.1f}s{err}", file=sys.stderr, flush=True)

    if jobs <= 1:
        for t in tasks:
            done(t, run_task(t))
    else:
        with cf.ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_task, t): t for t in tasks}
            for fut in cf.as_completed(futures):
                done(futures[fut], fut.result())
    for run in runs:
        sc = run["scenario"]
        opt = optimum.get(sc)
        if opt is None:  # local: the best any method found for this seed
            same = [r for r in runs if r["scenario"] == sc and r["seed"] == run["seed"]]
            opt = max((t["throughput"] for r in same for t in r["trials"] if t["stage"] == "system" and t["feasible"]
                       and t["throughput"] is not None), default=None)
        s = summarize(run, opt, budget, limits.get(sc))
        s["seed"] = run["seed"]
        report["scenarios"][sc]["methods"][run["method"]].append(s)
    for sc_rep in report["scenarios"].values():
        for rows in sc_rep["methods"].values():
            rows.sort(key=lambda r: r["seed"])
    report["runs"] = sorted(runs, key=lambda r: (r["scenario"], r["method"], r["seed"]))
    report["wall_s"] = time.monotonic() - t0
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    table = render_table(report) + (f"\nWall time: {report['wall_s']:.0f} s with {jobs} worker(s); load average at the "
                                     f"end {_loadavg()}.\n")
    report["verdict"] = verdict(report)
    (out / "table.md").write_text(table)
    (out / "raw.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "verdict.json").write_text(json.dumps(report["verdict"], indent=1, default=str))
    try:
        plot(report, out / "best_so_far.png")
    except Exception as e:  # noqa: BLE001 - a plotting problem must not lose the table
        print(f"[compare] plot failed: {e}", file=sys.stderr)
    print(table, file=log)
    print(f"[compare] results in {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(report["verdict"], default=str), flush=True)
    report["out_dir"] = str(out)
    return report


def sim_ground_truths(scenario: str, scenario_file: str | None, budget: Budget,
                      perturb: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The simulator's stage-1 optimum (exhaustive) and stage-2 best grid score for one scenario."""
    from mart.trial_runner.sim.model import ground_truth, ground_truth_learning

    # a shipped name as such (cached by name); a file or a perturbed model as its scenario object
    sc = scenario if scenario_file is None and perturb is None else sim_scenario(scenario, scenario_file, perturb)
    return (ground_truth(sc, budget.memory_margin, budget.system_horizon),
            ground_truth_learning(sc, budget.learning_horizon))


if __name__ == "__main__":
    main()
