"""Stage 1's decisions under measurement noise: mart on the simulator with its timing noise scaled.

For each shipped scenario (``bench.compare.SCENARIOS``) x seed, mart runs stage 1 alone (rules agents, auto
approval, the budget of ``bench/compare.py``: 12 trials of 6 steps, 10% margin) with the simulator's timing
noise (``trial.TIMING_NOISE``, a lognormal jitter of every phase of every step) scaled by 0 (the reference), 1,
3 and 5 (``--backend-option noise_scale=S``). The noise draws of a seed are the same at every scale, only scaled.
Figures per scale:

* ``true_gain_share``: per (scenario, seed) pair, the noise-free gain of mart's reported winner over the baseline
  (``model.expected_throughput``, the same window) divided by the noise-free gain of the winner mart reports in
  the same scenario and seed with the noise scaled to 0; then the median over pairs and the share of pairs at
  >= 0.95. A kept baseline's gain is 0. (A reference gain below 1% would make the ratio meaningless: such a pair
  scores 1 when the reported winner loses less than 1%, else 0; the shipped scenarios have none.)
* ``ci_coverage``: the share of sessions whose reported interval (``summary.system.gain_interval``, from the
  interleaved re-measurement) covers the reported winner's noise-free gain. A kept baseline claims a gain of 0,
  which is its true gain: it counts as covered when its interval (the rejected config's) covers 0, or that
  config's own true gain, or when there is none (no candidate measured faster). A winner reported without an
  interval counts as not covered.

Targets (issue 43) at 3x: ``true_gain_share`` >= 0.95 in >= 80% of pairs and ``ci_coverage`` >= 0.9.

    python bench/noise.py                  # 4 scenarios x 5 seeds x scales 0, 1, 3, 5 (prints JSON)
    python bench/noise.py --seeds 2 --scales 3 --scenarios qwen3-0.6b-1x8
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.baselines import Budget  # noqa: E402
from bench.compare import SCENARIOS, _loadavg, _rmtree, run_mart, sim_scenario  # noqa: E402

#: the issue's targets at 3x
TARGET_SCALE, TARGET_SHARE, TARGET_PAIRS, TARGET_COVERAGE = 3.0, 0.95, 0.8, 0.9
#: a reference gain below this (percent) is no gain to take a share of
MIN_REFERENCE_GAIN = 1.0


def run_one(task: dict[str, Any]) -> dict[str, Any]:
    """One stage-1 session (``bench.compare.run_mart``) at one noise scale, reduced to what the figures need."""
    from mart.trial_runner.sim import model

    budget = Budget(**task["budget"])
    workdir = Path(tempfile.mkdtemp(prefix="mart-noise-"))
    t0 = time.monotonic()
    try:
        res = run_mart({**task, "workload": "sim", "stages": ["system"]}, budget, workdir)
    finally:
        _rmtree(workdir)
    out: dict[str, Any] = {k: task[k] for k in ("scenario", "seed", "noise_scale")}
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if res.error:
        return {**out, "error": res.error}
    system = (res.extra.get("summary") or {}).get("system") or {}
    sc = sim_scenario(task["scenario"])
    base = model.base_config(sc)

    def true_gain(overrides: dict[str, Any] | None) -> float | None:
        if overrides is None:
            return None
        b, _ = model.expected_throughput(base, sc, budget.system_horizon)
        w, _ = model.expected_throughput({**base, **overrides}, sc, budget.system_horizon)
        return 100.0 * (w / b - 1)

    rejected = None
    of = (system.get("remeasure") or {}).get("of")
    if system.get("kept_baseline") and of:
        rejected = next((t.overrides for t in res.trials if t.trial_id == of), None)
    return {**out, "kept_baseline": bool(system.get("kept_baseline")), "best_config": res.best_system,
            "true_gain_pct": true_gain(res.best_system), "rejected_true_gain_pct": true_gain(rejected),
            "reported_gain_pct": system.get("throughput_gain_pct"), "gain_interval": system.get("gain_interval"),
            "decision": system.get("decision"), "rounds": (system.get("remeasure") or {}).get("rounds"),
            "disturbed": len(system.get("disturbed") or {}), "trials": len(res.trials),
            "gpu_hours": system.get("gpu_hours")}


def covered(run: dict[str, Any]) -> bool:
    """Whether the session's reported interval covers the reported winner's true gain (module docstring)."""
    iv = run.get("gain_interval")

    def covers(v: float | None) -> bool:
        return iv is not None and v is not None and iv.get("lo") is not None and iv.get("hi") is not None \
            and iv["lo"] <= v <= iv["hi"]

    if run.get("kept_baseline"):
        return iv is None or covers(0.0) or covers(run.get("rejected_true_gain_pct"))
    return covers(run.get("true_gain_pct"))


def share(run: dict[str, Any], ref: dict[str, Any]) -> float | None:
    g, g0 = run.get("true_gain_pct"), ref.get("true_gain_pct")
    if g is None or g0 is None:
        return None
    if g0 < MIN_REFERENCE_GAIN:
        return 1.0 if g > -MIN_REFERENCE_GAIN else 0.0
    return g / g0


def figures(runs: list[dict[str, Any]], scales: list[float]) -> dict[str, Any]:
    refs = {(r["scenario"], r["seed"]): r for r in runs if r["noise_scale"] == 0 and not r.get("error")}
    out: dict[str, Any] = {}
    for s in scales:
        rows = [r for r in runs if r["noise_scale"] == s and not r.get("error")]
        pairs = [(r, refs.get((r["scenario"], r["seed"]))) for r in rows]
        shares = [(r, v) for r, ref in pairs if ref is not None and (v := share(r, ref)) is not None]
        vals = [v for _, v in shares]
        cov = [covered(r) for r in rows]
        taken = [covered(r) for r in rows if not r.get("kept_baseline")]
        out[f"{s:g}x"] = {
            "sessions": len(rows), "errors": sum(1 for r in runs if r["noise_scale"] == s and r.get("error")),
            "true_gain_share": {
                "median": round(statistics.median(vals), 4) if vals else None,
                "pairs_at_least_0.95": round(sum(v >= TARGET_SHARE for v in vals) / len(vals), 4) if vals else None,
                "per_pair": {f"{r['scenario']}/{r['seed']}": round(v, 4) for r, v in shares},
            },
            "ci_coverage": round(sum(cov) / len(cov), 4) if cov else None,
            "ci_coverage_taken": round(sum(taken) / len(taken), 4) if taken else None,
            "kept_baseline": sum(bool(r.get("kept_baseline")) for r in rows),
            "disturbed": sum(r.get("disturbed") or 0 for r in rows),
            "remeasure_share_of_gpu_hours": _median([
                r["gpu_hours"]["remeasure"] / r["gpu_hours"]["total"] for r in rows
                if (r.get("gpu_hours") or {}).get("total")]),
        }
        if s == TARGET_SCALE and vals and cov:
            out[f"{s:g}x"]["meets_targets"] = {
                "true_gain_share": sum(v >= TARGET_SHARE for v in vals) / len(vals) >= TARGET_PAIRS,
                "ci_coverage": sum(cov) / len(cov) >= TARGET_COVERAGE}
    return out


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", nargs="+", default=SCENARIOS)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--scales", type=float, nargs="+", default=[1.0, 3.0, 5.0],
                   help="noise scales besides the reference 0 (default 1 3 5)")
    p.add_argument("--system-trials", type=int, default=12)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--out", default=None, help="also write the JSON (and every session's figures) here")
    args = p.parse_args(argv)
    scales = sorted({float(s) for s in args.scales} - {0.0})
    budget = Budget(system_trials=args.system_trials, learning_trials=0)
    tasks = [{"method": "mart", "scenario": sc, "seed": seed, "noise_scale": s, "budget": asdict(budget)}
             for sc in args.scenarios for seed in range(args.seeds) for s in [0.0, *scales]]
    t0, load0 = time.monotonic(), _loadavg()
    runs: list[dict[str, Any]] = []
    with cf.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for fut in cf.as_completed([pool.submit(run_one, t) for t in tasks]):
            r = fut.result()
            runs.append(r)
            iv = r.get("gain_interval") or {}
            print(f"[noise] {r['scenario']} seed {r['seed']} x{r['noise_scale']:g}: "
                  + (f"ERROR {r['error']}" if r.get("error") else
                     f"true gain {r['true_gain_pct']:+.1f}%, {r['decision']}"
                     + (f", interval {iv.get('lo')}..{iv.get('hi')}" if iv else "")
                     + f", covered {covered(r)}, {r['wall_s']:.0f}s"),
                  file=sys.stderr, flush=True)
            if args.out:  # as they come, so that a long run's partial figures survive
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / "runs.jsonl").open("a").write(json.dumps(r) + "\n")
    result = {"scales": figures(runs, scales), "sessions": len(runs), "jobs": args.jobs,
              "wall_s": round(time.monotonic() - t0, 1), "loadavg": [load0, _loadavg()],
              "budget": asdict(budget), "scenarios": args.scenarios, "seeds": args.seeds}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "noise.json").write_text(json.dumps({**result, "runs": runs}, indent=1))
    return result


if __name__ == "__main__":
    main()
