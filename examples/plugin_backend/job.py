"""The user's "training job": a toy stand-in for a real trainer, speaking mart's trial-directory contract.

    python job.py --config cfg.json --steps N --out TRIAL_DIR

Writes one verl-format line per step to ``TRIAL_DIR/metrics.jsonl`` ({"step": N, "data": {...}}), then
``status.json`` (completed / oom). SIGTERM ends it with status ``stopped``. A real job would train here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

WORKERS, BATCH, LR = "job.workers", "job.batch_size", "job.lr"


def write_status(out: Path, status: str, reason: str | None, last_step: int) -> None:
    tmp = out / "status.json.tmp"
    tmp.write_text(json.dumps({"status": status, "reason": reason, "last_step": last_step}))
    os.replace(tmp, out / "status.json")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--capacity-gb", type=float, default=8.0)
    ap.add_argument("--step-s", type=float, default=0.02)
    a = ap.parse_args()
    out = Path(a.out)
    cfg = json.loads(Path(a.config).read_text())
    workers, batch, lr = int(cfg[WORKERS]), int(cfg[BATCH]), float(cfg[LR])
    last = 0

    def on_term(signum, frame):  # mart stops a trial with SIGTERM
        write_status(out, "stopped", "SIGTERM", last)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    memory = 0.5 + 0.05 * batch * (1 + 0.1 * workers)
    step_time = 1.0 / min(workers, 8) + 8.0 / batch  # more workers and bigger batches are faster
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 0, "data": {"val-core/toy/reward/mean@1": 0.2}}) + "\n")
        for step in range(1, a.steps + 1):
            time.sleep(a.step_s)
            if memory > a.capacity_gb:
                write_status(out, "oom", f"needs {memory:.1f} GB of {a.capacity_gb} GB", last)
                return 1
            score = 0.2 + 0.5 * (1 - math.exp(-step * lr * 50)) - (0.3 if lr > 0.03 else 0.0)
            data = {"timing_s/step": step_time, "perf/throughput": batch * 100 / step_time,
                    "perf/max_memory_allocated_gb": memory, "critic/score/mean": score, "actor/entropy": 1.0}
            if step == a.steps:
                data["val-core/toy/reward/mean@1"] = score
            f.write(json.dumps({"step": step, "data": data}) + "\n")
            f.flush()
            last = step
    write_status(out, "completed", None, last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
