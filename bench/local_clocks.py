"""Does the local workload's compared throughput hold still on a busy machine? (docs/backends.md quotes it.)

    python bench/local_clocks.py                       # 3 rounds of the default config, 6 steps each
    python bench/local_clocks.py --hogs 2              # the same beside 2 busy loops (one per core of a 2-core box)
    python bench/local_clocks.py --hogs 2 --variant actor_rollout_ref.rollout.max_num_seqs=64

Each trial is ``mart trial --backend local --steps N`` (a variant runs right after the baseline in each round, so
drift hits both). Per trial it prints stage 1's figure (``mart/compared_throughput``: tokens per CPU-second of the
trainer thread, mean over updates 3-5, ``mart.state.objectives.system_throughput``) beside the wall-clock
``perf/throughput`` over the same steps, each phase's compared (CPU) and wall seconds, the CPU share of the wall time
and the 1-minute load average (``os.getloadavg``) at the start and end of the trial. ``--hogs N`` starts N
``python -c 'while True: pass'`` processes of its own and kills them (by their pids) before it exits. The last line is
one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mart.state.metrics import THROUGHPUT_KEY, mean_over_steps, parse_line, phase_seconds  # noqa: E402
from mart.state.objectives import system_throughput, throughput_window  # noqa: E402

PHASES = ("gen", "old_log_prob", "ref", "update_actor", "step")


def trial(name: str, sets: list[str], steps: int, root: Path) -> dict:
    out = root / name
    load0 = os.getloadavg()[0]
    cmd = [sys.executable, "-m", "mart.graph.cli", "trial", "--backend", "local", "--steps", str(steps),
           "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    recs = [r for line in (out / "metrics.jsonl").read_text().splitlines() if (r := parse_line(line))]
    first, last = throughput_window(steps)
    window = [r for r in recs if first <= r.step <= last]

    def mean(values) -> float:
        vals = [v for v in values if not math.isnan(v)]
        return statistics.fmean(vals) if vals else math.nan

    return {
        "trial": name, "load_start": load0, "load_end": os.getloadavg()[0],
        "compared_throughput": system_throughput(recs, steps),
        "wall_throughput": mean_over_steps(recs, THROUGHPUT_KEY, first, last),
        "cpu_share": mean(r.get("mart/cpu_share") for r in window),
        "compared_s": {p: mean(phase_seconds(r, p) for r in window) for p in PHASES},
        "wall_s": {p: mean(r.get(f"timing_s/{p}") for r in window) for p in PHASES},
        "per_step_compared_s": [round(phase_seconds(r, "step"), 4) for r in recs if r.step >= 1],
        "per_step_wall_s": [round(r.get("timing_s/step"), 4) for r in recs if r.step >= 1],
    }


def _show(row: dict) -> None:
    ph = "  ".join(f"{p} {row['compared_s'][p]:.3f}/{row['wall_s'][p]:.3f}" for p in ("gen", "update_actor", "step"))
    print(f"{row['trial']:14s} load {row['load_start']:4.1f}->{row['load_end']:4.1f}  "
          f"compared {row['compared_throughput']:6.0f} tok/s  wall {row['wall_throughput']:6.0f} tok/s  "
          f"cpu share {row['cpu_share']:.2f}  (cpu/wall s) {ph}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--hogs", type=int, default=0, help="busy-loop processes to run beside the trials")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                   help="also run this config (after the baseline in each round)")
    args = p.parse_args(argv)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    root = Path(tempfile.mkdtemp(prefix="mart-clocks-"))
    rows: list[dict] = []
    try:
        time.sleep(2 if hogs else 0)  # let the hogs reach the load average
        for i in range(args.rounds):
            for name, sets in [("baseline", [])] + ([("variant", args.variant)] if args.variant else []):
                rows.append(trial(f"{name}-r{i}", sets, args.steps, root))
                _show(rows[-1])
    finally:
        for h in hogs:  # only the processes this script started
            h.kill()
            h.wait()
        shutil.rmtree(root, ignore_errors=True)
    summary = {"hogs": args.hogs, "variant": args.variant, "steps": args.steps, "trials": rows}
    for kind in ("baseline", "variant"):
        mine = [r for r in rows if r["trial"].startswith(kind)]
        if mine:
            for key in ("compared_throughput", "wall_throughput"):
                vals = [r[key] for r in mine]
                summary[f"{kind}_{key}"] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
