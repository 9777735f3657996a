"""Stage 1 with N trials at once: how fast each method reaches the optimum in wall clock, and at what GPU cost.

For each scenario x seed and each N in ``--parallel`` (1 is always run too, the reference), every method gets
the same stage-1 budget: mart (its session with ``--parallel N``), Optuna's TPE with ``constant_liar=True`` on the
restricted space (``tpe-cl``), random and grid search, all asynchronous (a freed slot starts the next trial at
once) on the simulator's clock (``bench/baselines/parallel.py``). Reported per method and N, as medians and
ranges: wall clock to 97% of the simulator's optimum in trial-time units (one unit = the default config's trial),
GPU-hours spent by then, and the best throughput at equal wall clock. The verdict checks the issue's targets: at
the largest N, mart reaches 97% within 40% of its N=1 wall clock with at most 1.25x its N=1 GPU-hours, and is at
least constant-liar TPE's best at equal N and wall clock in >= 80% of pairs. Beside it, the floor: per pair, the
shortest trial at or above 97% that any run measured, over N=1's time to 97% (``floor_ratio``); where it is above
0.40, no schedule of the configs seen meets the wall-clock target (a trial counts once it ends).

    python bench/parallel.py --parallel 4                     # 4 scenarios x 5 seeds
    python bench/parallel.py --parallel 2 4 --quick --json    # 2 scenarios x 3 seeds, one JSON verdict on stdout
    python bench/compare.py --parallel 4                      # the same, from the main benchmark's entry point
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
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

from bench.baselines.common import Budget  # noqa: E402
from bench.baselines.parallel import (  # noqa: E402
    PARALLEL_METHODS,
    best_at,
    best_so_far,
    mart_timeline,
    run_parallel_method,
    time_to,
)
from bench.compare import QUICK_SCENARIOS, SCENARIOS, backend_options, make_backend, sim_ground_truths  # noqa: E402

METHODS = ["mart", *PARALLEL_METHODS]
TARGET = 0.97
TIME_RATIO_MAX = 0.40
GPU_RATIO_MAX = 1.25
WIN_SHARE = 0.80
#: where else the line could fall: the same ratios to 95% and 99% of the optimum (printed, not judged)
SENSITIVITY = (0.95, TARGET, 0.99)


def run_mart(task: dict[str, Any], budget: Budget, workdir: Path) -> dict[str, Any]:
    """mart's stage 1 with ``task['slots']`` slots on the virtual clock; its trials with simulated start and end."""
    from mart.graph.session import tune
    from mart.state.ledger import Ledger
    from mart.state.options import TuneOptions

    opts = dict(backend_options("sim", task["scenario"], task["seed"], task.get("scenario_file"), task.get("perturb")))
    opts["clock"] = "virtual"
    options = TuneOptions(backend="sim", backend_options=opts, approve="auto", agents="rules", runs_dir=str(workdir),
                          seed=task["seed"], stages=["system"], system_trials=budget.system_trials,
                          system_horizon=budget.system_horizon, memory_margin=budget.memory_margin, quiet=True,
                          report=False, watch_interval_s=0.001, parallel=task["slots"])
    summary = tune(options)
    run_dir = workdir / summary["run_id"]
    times = mart_timeline(run_dir)
    limit = summary["system"]["memory_limit_gb"]
    ledger = Ledger.open(run_dir)
    try:
        rows = ledger.trials("system")
    finally:
        ledger.close()
    trials = []
    for r in rows:
        state = json.loads((Path(r["trial_dir"]) / "sim_state.json").read_text())
        start, end = times.get(r["trial_id"], (None, None))
        feasible = (r["status"] == "completed" and r["throughput"] is not None
                    and (limit is None or (r["peak_memory_gb"] or 0.0) <= limit))
        trials.append({"throughput": r["throughput"], "feasible": feasible, "status": r["status"],
                       "gpu_hours": float(state.get("gpu_hours") or 0.0), "started_s": start, "ended_s": end,
                       "overrides": r.get("overrides") or {}})
    return {"trials": trials, "best_throughput": summary["system"]["best_throughput"]}


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    budget = Budget(**task["budget"])
    workdir = Path(tempfile.mkdtemp(prefix=f"mart-par-{task['method']}-"))
    try:
        if task["method"] == "mart":
            out = run_mart(task, budget, workdir)
        else:
            backend = make_backend("sim", task["scenario"], task["seed"], task.get("scenario_file"), task.get("perturb"))
            res = run_parallel_method(task["method"], backend, scenario=task["scenario"], seed=task["seed"],
                                      budget=budget, workdir=workdir, slots=task["slots"])
            out = {"trials": [t.to_dict() for t in res.trials], "best_throughput": res.best_throughput,
                   "error": res.error}
    except Exception as e:  # noqa: BLE001 - one failing run must not lose the others
        out = {"trials": [], "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return {**{k: task[k] for k in ("method", "scenario", "seed", "slots")}, **out}


def unit_s(run: dict[str, Any]) -> float:
    """One trial-time unit: the default config's trial (the run's first trial, always the defaults)."""
    first = min((t for t in run["trials"] if t.get("ended_s") is not None), key=lambda t: t["started_s"] or 0.0,
                default=None)
    return max(1e-9, (first["ended_s"] - first["started_s"])) if first else 1.0


def _med(xs: list[float | None], fmt: str = "{:.2f}") -> str:
    ys = [x for x in xs if x is not None]
    if not ys:
        return "—"
    s = fmt.format(statistics.median(ys))
    return s + (f" [{fmt.format(min(ys))}–{fmt.format(max(ys))}]" if len(ys) > 1 and min(ys) != max(ys) else "")


def summarize(runs: list[dict[str, Any]], optimum: dict[str, float], slots: list[int]) -> dict[str, Any]:
    """Per run: wall clock (units) and GPU-hours to 97%; per (scenario, seed): mart against itself at N=1 and
    against constant-liar TPE at equal N and wall clock."""
    by = {(r["method"], r["scenario"], r["seed"], r["slots"]): r for r in runs}
    rows = []
    for r in runs:
        curve = best_so_far(r["trials"])
        u = unit_s(by.get((r["method"], r["scenario"], r["seed"], 1), r))
        when, gpu = time_to(curve, TARGET * optimum[r["scenario"]])
        end = max((t["ended_s"] for t in r["trials"] if t.get("ended_s") is not None), default=None)
        rows.append({**{k: r[k] for k in ("method", "scenario", "seed", "slots")},
                     "to97_units": None if when is None else when / u, "to97_gpu_h": gpu,
                     "wall_units": None if end is None else end / u, "gpu_h": sum(t["gpu_hours"] for t in r["trials"]),
                     "best_pct": None if not r.get("best_throughput") else 100 * r["best_throughput"] / optimum[r["scenario"]],
                     "error": r.get("error")})
    idx = {(x["method"], x["scenario"], x["seed"], x["slots"]): x for x in rows}
    checks: dict[str, Any] = {}
    top = max(slots)
    pairs = [(sc, s) for (m, sc, s, n) in idx if m == "mart" and n == top]
    ratios, gpu_ratios = ratio_lists(by, optimum, pairs, top, TARGET)
    # GPU-hours to 97% over N=1's = the wall ratio x the slots busy on average until then (N=1 keeps one busy)
    busy = [g / w for w, g in zip(*_paired_ratios(by, optimum, pairs, top, TARGET)) if w and g is not None]
    wins = []
    for sc, s in pairs:
        tpe = by.get(("tpe-cl", sc, s, top))
        mart = by[("mart", sc, s, top)]
        if tpe is not None:
            t_end = max((t["ended_s"] for t in mart["trials"] if t.get("ended_s") is not None), default=0.0)
            a, b = best_at(best_so_far(mart["trials"]), t_end), best_at(best_so_far(tpe["trials"]), t_end)
            wins.append((a or 0.0) >= (b or 0.0))
    floors = [f for f in (floor_ratio(runs, optimum, sc, s, unit_s(by[("mart", sc, s, 1)]), idx[("mart", sc, s, 1)])
                          for sc, s in pairs if ("mart", sc, s, 1) in by) if f is not None]
    reached = sum(1 for sc, s in pairs if idx[("mart", sc, s, top)]["to97_units"] is not None)
    # what the whole session costs (the same trial budget at either N), beside the cost up to 97%
    session = [idx[("mart", sc, s, top)]["gpu_h"] / idx[("mart", sc, s, 1)]["gpu_h"] for sc, s in pairs
               if ("mart", sc, s, 1) in idx and idx[("mart", sc, s, 1)]["gpu_h"]]
    checks = {
        "slots": top, "pairs": len(pairs), "mart_reached_97_pct": reached,
        "time_ratio_median": statistics.median(ratios) if ratios else None,
        "time_ratio_ok_share": (sum(r <= TIME_RATIO_MAX for r in ratios) / len(ratios)) if ratios else None,
        "gpu_ratio_median": statistics.median(gpu_ratios) if gpu_ratios else None,
        "gpu_ratio_ok_share": (sum(r <= GPU_RATIO_MAX for r in gpu_ratios) / len(gpu_ratios)) if gpu_ratios else None,
        "beats_tpe_cl_share": (sum(wins) / len(wins)) if wins else None,
        "time_ratio_floor_median": statistics.median(floors) if floors else None,
        "pairs_floor_above_target": sum(f > TIME_RATIO_MAX for f in floors),
        "session_gpu_ratio_median": statistics.median(session) if session else None,
        "busy_slots_to97_median": statistics.median(busy) if busy else None,
        "time_ratio_by_target": {f"{t:.2f}": ratios_at(by, optimum, pairs, top, t) for t in SENSITIVITY},
    }
    checks["meets_targets"] = bool(
        checks["time_ratio_median"] is not None and checks["time_ratio_median"] <= TIME_RATIO_MAX
        and checks["gpu_ratio_median"] is not None and checks["gpu_ratio_median"] <= GPU_RATIO_MAX
        and (checks["beats_tpe_cl_share"] or 0.0) >= WIN_SHARE)
    return {"rows": rows, "checks": checks}


def ratio_lists(by: dict[tuple, dict[str, Any]], optimum: dict[str, float], pairs: list[tuple[str, int]], top: int,
                target: float) -> tuple[list[float], list[float]]:
    """mart's wall-clock and GPU-hour ratios (N=top over N=1) to ``target`` x the optimum, per pair where both
    reach it."""
    walls, gpus = _paired_ratios(by, optimum, pairs, top, target)
    return [w for w in walls if w is not None], [g for g in gpus if g is not None]


def _paired_ratios(by: dict[tuple, dict[str, Any]], optimum: dict[str, float], pairs: list[tuple[str, int]], top: int,
                   target: float) -> tuple[list[float | None], list[float | None]]:
    """``ratio_lists`` pair by pair, None where a ratio cannot be taken, so the two lists line up."""
    walls: list[float | None] = []
    gpus: list[float | None] = []
    for sc, s in pairs:
        one, many = by.get(("mart", sc, s, 1)), by.get(("mart", sc, s, top))
        if one is None or many is None:
            continue
        (w1, g1), (wn, gn) = (time_to(best_so_far(r["trials"]), target * optimum[sc]) for r in (one, many))
        walls.append(wn / w1 if w1 and wn is not None else None)
        gpus.append(gn / g1 if g1 and gn is not None else None)
    return walls, gpus


def ratios_at(by: dict[tuple, dict[str, Any]], optimum: dict[str, float], pairs: list[tuple[str, int]], top: int,
              target: float) -> dict[str, Any]:
    """The medians of ``ratio_lists`` at ``target``: how much the verdict owes to where the 97% line falls."""
    walls, gpus = ratio_lists(by, optimum, pairs, top, target)
    return {"pairs": len(walls), "time_ratio_median": statistics.median(walls) if walls else None,
            "gpu_ratio_median": statistics.median(gpus) if gpus else None}


def floor_ratio(runs: list[dict[str, Any]], optimum: dict[str, float], scenario: str, seed: int, unit: float,
                one: dict[str, Any]) -> float | None:
    """The earliest wall clock, over mart's N=1 time to 97%, at which any schedule could have reached 97% on this
    pair: the shortest feasible trial at or above 97% that any run of the pair measured (any method, any N),
    started at time 0. A trial counts once it ends, so no number of slots does better with the configs seen; a
    ratio target below it cannot be met on the pair. None when N=1 never reached 97% or no such trial exists."""
    if not one.get("to97_units"):
        return None
    lengths = [(t["ended_s"] - t["started_s"]) / unit for r in runs if r["scenario"] == scenario and r["seed"] == seed
               for t in r["trials"] if t.get("feasible") and t.get("throughput") is not None
               and t.get("ended_s") is not None and t["throughput"] >= TARGET * optimum[scenario]]
    return min(lengths) / one["to97_units"] if lengths else None


def render(report: dict[str, Any]) -> str:
    rows = report["summary"]["rows"]
    lines = ["| method | N | wall clock to 97% (trial units) | GPU-h to 97% | session wall (units) | GPU-h | best % of optimum | reached 97% |",
             "|---|---|---|---|---|---|---|---|"]
    for m in report["methods"]:
        for n in report["slots"]:
            rs = [r for r in rows if r["method"] == m and r["slots"] == n]
            if not rs:
                continue
            reached = sum(r["to97_units"] is not None for r in rs)
            lines.append(f"| {m} | {n} | {_med([r['to97_units'] for r in rs])} | {_med([r['to97_gpu_h'] for r in rs], '{:.1f}')} | "
                         f"{_med([r['wall_units'] for r in rs])} | {_med([r['gpu_h'] for r in rs], '{:.1f}')} | "
                         f"{_med([r['best_pct'] for r in rs], '{:.1f}')} | {reached}/{len(rs)} |")
    c = report["summary"]["checks"]
    lines.append("")
    lines.append(f"mart at N={c['slots']} vs N=1 ({c['pairs']} pairs, {c['mart_reached_97_pct']} reached 97%): wall-clock "
                 f"ratio median {_fmt(c['time_ratio_median'])} (target <= {TIME_RATIO_MAX}), GPU-hour ratio median "
                 f"{_fmt(c['gpu_ratio_median'])} (target <= {GPU_RATIO_MAX}); mart >= tpe-cl at equal N and wall clock in "
                 f"{_fmt(c['beats_tpe_cl_share'], pct=True)} of pairs (target >= {WIN_SHARE:.0%}). "
                 f"Targets met: {c['meets_targets']}.")
    if c.get("time_ratio_floor_median") is not None:
        lines.append(f"Floor (the shortest >=97% trial any run of the pair measured, started at once, over N=1's time "
                     f"to 97%): median {_fmt(c['time_ratio_floor_median'])}; above the {TIME_RATIO_MAX} target in "
                     f"{c['pairs_floor_above_target']} of {c['pairs']} pairs, where no schedule of these configs meets it.")
    if c.get("busy_slots_to97_median") is not None:
        lines.append(f"Slots busy on average until 97% (the GPU-hour ratio over the wall-clock ratio; N=1 keeps 1): "
                     f"median {_fmt(c['busy_slots_to97_median'])} of {c['slots']}, so {GPU_RATIO_MAX}x GPU-hours "
                     f"needs a wall-clock ratio <= {_fmt(GPU_RATIO_MAX / c['busy_slots_to97_median'])} with slots as busy.")
    if c.get("session_gpu_ratio_median") is not None:
        lines.append(f"Whole session (the same {report['budget']['system_trials']}-trial budget): GPU-hours at "
                     f"N={c['slots']} over N=1, median {_fmt(c['session_gpu_ratio_median'])}.")
    if c.get("time_ratio_by_target"):
        lines.append("By target (pairs where both N reach it: wall-clock / GPU-hour ratio medians): " + "; ".join(
            f"{float(t):.0%}: {_fmt(v['time_ratio_median'])} / {_fmt(v['gpu_ratio_median'])} ({v['pairs']} pairs)"
            for t, v in c["time_ratio_by_target"].items()) + ".")
    return "\n".join(lines)


def _fmt(v: float | None, pct: bool = False) -> str:
    return "—" if v is None else (f"{v:.0%}" if pct else f"{v:.2f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parallel", type=int, nargs="+", required=True, metavar="N", help="trial slots (1 is added)")
    p.add_argument("--quick", action="store_true", help="2 scenarios x 3 seeds")
    p.add_argument("--scenarios", nargs="+", default=None)
    p.add_argument("--scenario-file", action="append", default=[], metavar="FILE")
    p.add_argument("--perturb", type=int, default=None, metavar="SEED")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--system-trials", type=int, default=12)
    p.add_argument("--system-horizon", type=int, default=6)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    if any(n < 1 for n in args.parallel):
        p.error("--parallel: N >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.compare import sim_scenario

    args = parse_args(argv)
    slots = sorted({1, *args.parallel})
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}: choose from {METHODS}")
    budget = Budget(system_trials=args.system_trials, learning_trials=0, system_horizon=args.system_horizon)
    files = {sc: None for sc in (args.scenarios or ([] if args.scenario_file else
                                                    (QUICK_SCENARIOS if args.quick else SCENARIOS)))}
    for f in args.scenario_file:
        files[sim_scenario("", f).name] = str(Path(f).resolve())
    seeds = list(range(args.seeds or (3 if args.quick else 5)))
    optimum = {sc: sim_ground_truths(sc, path, budget, args.perturb)[0]["throughput"] for sc, path in files.items()}
    tasks = [{"method": m, "scenario": sc, "scenario_file": path, "perturb": args.perturb, "seed": s, "slots": n,
              "budget": asdict(budget)} for sc, path in files.items() for s in seeds for n in slots for m in methods]
    log = sys.stderr if args.json else sys.stdout
    t0 = time.monotonic()
    runs = []
    with cf.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for fut in cf.as_completed([pool.submit(run_task, t) for t in tasks]):
            r = fut.result()
            runs.append(r)
            print(f"[parallel] {r['method']} N={r['slots']} {r['scenario']} seed {r['seed']}"
                  + (f" ERROR {r['error']}" if r.get("error") else ""), file=sys.stderr)
    report = {"slots": slots, "methods": methods, "budget": asdict(budget), "optimum": optimum, "seeds": seeds,
              "perturb": args.perturb, "runs": runs, "wall_s": time.monotonic() - t0,
              "load_avg": os.getloadavg()}
    report["summary"] = summarize(runs, optimum, slots)
    out = Path(args.out) / time.strftime("parallel-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    table = render(report)
    (out / "table.md").write_text(table + "\n")
    (out / "raw.json").write_text(json.dumps(report, indent=1, default=str))
    print(table, file=log)
    print(f"[parallel] {len(runs)} runs in {report['wall_s']:.0f} s (load average {report['load_avg'][0]:.2f}); "
          f"results in {out}", file=log)
    if args.json:
        print(json.dumps(report["summary"]["checks"]))
    return report


if __name__ == "__main__":
    main()
