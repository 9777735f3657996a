"""The tuner's own cost: wall time per trial spent outside trials, and the run's SQLite size.

    python bench/tuner_overhead.py            # instant toy trials: pure graph/ledger/agent overhead
    python bench/tuner_overhead.py --local    # plus one default session on the local workload (minutes)

Prints a table; nothing is asserted (speed figures belong here, not in tests).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mart.graph.session import tune  # noqa: E402
from mart.state.ledger import Ledger  # noqa: E402
from mart.state.options import TuneOptions  # noqa: E402


def measure(options: TuneOptions) -> dict:
    t0 = time.perf_counter()
    summary = tune(options)
    wall = time.perf_counter() - t0
    run_dir = Path(options.runs_dir) / summary["run_id"]
    ledger = Ledger.open(run_dir)
    trials = ledger.trials()
    in_trials = sum(t["wall_s"] or 0.0 for t in trials)
    checkpoints = ledger.db.execute("select count(*), sum(length(checkpoint)) from checkpoints").fetchone()
    size = sum(f.stat().st_size for f in run_dir.glob("mart.sqlite*"))
    return {
        "backend": options.backend.split(":")[0].rsplit(".", 1)[-1],
        "trials": len(trials),
        "wall_s": wall,
        "in_trials_s": in_trials,
        "overhead_per_trial_s": (wall - in_trials) / max(1, len(trials)),
        "sqlite_mb": size / 1e6,
        "checkpoints": checkpoints[0],
        "checkpoint_bytes_mean": (checkpoints[1] or 0) / max(1, checkpoints[0]),
        "throughput_gain_pct": summary["system"]["throughput_gain_pct"],
        "score_gain": summary["learning"]["score_gain"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", action="store_true", help="also run a default session on the local workload")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(Path(__file__).resolve().parents[1])
        rows.append(measure(TuneOptions(backend="tests.support.toy_backend:make_backend", approve="auto", runs_dir=tmp,
                                        system_trials=6, learning_trials=5, quiet=True, watch_interval_s=0.05)))
        if args.local:
            rows.append(measure(TuneOptions(backend="local", approve="auto", runs_dir=tmp, quiet=True)))
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")


if __name__ == "__main__":
    main()
