"""Soak: ``kill -9`` the tuner at random moments of ``mart tune`` on the local workload, then ``mart resume``.

Each cycle starts (or resumes) a run, lets it go for a random time, and kills the driver with SIGKILL
(its trials live in their own process groups and are re-attached on resume). After ``--kills`` kills,
every run is resumed to the end without kills, and each is checked:

- the run completed and its trial count is exactly the budget (no lost trial, no extra one);
- no candidate ran twice, no trial is left ``running``, every trial's metric steps are 1..n without gaps;
- no trial process is left alive.

Prints the figures and exits 1 if any check fails. Example (about 15 min on 2 busy cores)::

    nice -n 10 python scripts/soak_kill.py --kills 50
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mart.trial_runner.local.config import TINY_CONFIG

# A local workload small enough for a soak (the test suite's tiny config): steps take ~0.1 s.
TINY = TINY_CONFIG


def query(db: Path, sql: str, args=()) -> list:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.runs = work / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.config = work / "tiny.json"
        self.config.write_text(json.dumps(TINY))
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "MART_CACHE_DIR": os.environ.get("MART_CACHE_DIR") or str(work / "cache")}
        self.rng = random.Random(args.seed)
        self.kills = 0
        self.kill_moments: list[float] = []
        self.starts_killed_before_a_run = 0
        self.resumes = 0
        self.started = 0

    def mart(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "mart.graph.cli", *argv]

    def tune_cmd(self) -> list[str]:
        a = self.args
        return self.mart("tune", "--backend", "local", "--base-config", str(self.config), "--approve", "auto",
                         "--system-trials", str(a.system_trials), "--learning-trials", str(a.learning_trials),
                         "--system-horizon", str(a.system_horizon), "--learning-horizon", str(a.learning_horizon),
                         "--runs-dir", str(self.runs), "--quiet", "--json")

    def resume_cmd(self, run: str) -> list[str]:
        return self.mart("resume", run, "--runs-dir", str(self.runs), "--quiet", "--json")

    def run_ids(self) -> set[str]:
        return {p.name for p in self.runs.iterdir() if not p.name.startswith(".") and (p / "mart.sqlite").exists()}

    def status(self, run: str) -> str | None:
        rows = query(self.runs / run / "mart.sqlite", "SELECT status FROM runs")
        return rows[0][0] if rows else None

    def drive_with_kill(self, cmd: list[str], run: str | None) -> tuple[bool, str | None]:
        """Start ``cmd``; once it drives its run (holds the run's lock), SIGKILL it after a random time.

        Returns (killed, run id). The delay counts from the moment the driver holds the lock, so every
        kill lands while a run is being driven (the interpreter's start-up is not what is tested).
        """
        before = self.run_ids()
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if run is None:
                run = next(iter(self.run_ids() - before), None)
            if run is not None and self.lock_pid(run) == proc.pid:
                break
            time.sleep(0.05)
        delay = self.rng.uniform(self.args.min_wait, self.args.max_wait)
        try:
            proc.wait(delay)
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[3:5])} failed ({proc.returncode}): {err.decode()[-2000:]}")
            return False, run or next(iter(self.run_ids() - before), None)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            proc.communicate()
            self.kills += 1
            self.kill_moments.append(round(delay, 2))
            if run is None:
                run = next(iter(self.run_ids() - before), None)
            return True, run

    def lock_pid(self, run: str) -> int | None:
        try:
            text = (self.runs / run / "lock").read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def run(self) -> dict:
        t0 = time.monotonic()
        current: str | None = None
        while self.kills < self.args.kills:
            if current is None:
                killed, current = self.drive_with_kill(self.tune_cmd(), None)
                if killed and current is None:
                    self.starts_killed_before_a_run += 1
                self.started += 1
            else:
                self.resumes += 1
                killed, _ = self.drive_with_kill(self.resume_cmd(current), current)
            if not killed or (current is not None and self.status(current) == "completed"):
                current = None
        # the end: every run to completion, without kills
        finals = {}
        for run in sorted(self.run_ids()):
            if self.status(run) != "completed":
                out = subprocess.run(self.resume_cmd(run), env=self.env, capture_output=True, text=True, timeout=1800)
                finals[run] = out.returncode
                if out.returncode != 0:
                    print(f"resume of {run} failed: {out.stderr[-2000:]}", file=sys.stderr)
        return {"seconds": round(time.monotonic() - t0, 1), "final_resumes": finals}

    def check(self) -> dict:
        budget = self.args.system_trials + self.args.learning_trials
        problems: list[str] = []
        runs = sorted(self.run_ids())
        trials_total = confirm_total = 0
        for run in runs:
            db = self.runs / run / "mart.sqlite"
            status = self.status(run)
            if status != "completed":
                problems.append(f"{run}: status {status}")
            rows = query(db, "SELECT trial_id, candidate_id, status, steps_done, horizon FROM trials")
            # stage 2's re-runs of close contenders (on another seed) are planned on top of the budget, at most
            # one per contender: counted apart, and a contender re-run twice is a duplicate
            confirms = [c for (c,) in query(db, "SELECT confirms FROM trials WHERE confirms IS NOT NULL")]
            trials_total += len(rows) - len(confirms)
            confirm_total += len(confirms)
            if len(rows) - len(confirms) != budget:
                problems.append(f"{run}: {len(rows) - len(confirms)} trials, budget {budget}")
            if len(confirms) != len(set(confirms)):
                problems.append(f"{run}: a contender was re-run twice")
            cands = [r[1] for r in rows if r[1]]
            if len(cands) != len(set(cands)):
                problems.append(f"{run}: a candidate ran twice")
            for trial_id, _, tstatus, _, _ in rows:
                if tstatus == "running":
                    problems.append(f"{run}/{trial_id}: still running")
                steps = [s for (s,) in query(db, "SELECT DISTINCT step FROM metrics WHERE trial_id=? ORDER BY step",
                                            (trial_id,))]
                if steps and steps != list(range(steps[0], steps[0] + len(steps))):
                    problems.append(f"{run}/{trial_id}: metric steps with gaps {steps}")
        leftover = self.leftover_trials()
        if leftover:
            problems.append(f"trial processes still alive: {leftover}")
        return {"runs": len(runs), "trials": trials_total, "confirm_trials": confirm_total, "problems": problems}

    def leftover_trials(self) -> list[int]:
        try:
            import psutil
        except ImportError:
            return []
        alive = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info.get("cmdline") or [])
            if str(self.runs) in cmd and "mart.trial_runner" in cmd:
                alive.append(p.info["pid"])
        return alive


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50, help="how many kill -9s in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-wait", type=float, default=0.0, help="shortest time driving before a kill (s)")
    ap.add_argument("--max-wait", type=float, default=10.0, help="longest time driving before a kill (s)")
    ap.add_argument("--system-trials", type=int, default=3)
    ap.add_argument("--learning-trials", type=int, default=2)
    ap.add_argument("--system-horizon", type=int, default=4)
    ap.add_argument("--learning-horizon", type=int, default=6)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mart-soak-") as tmp:
        work = args.workdir or Path(tmp)
        soak = Soak(args, work)
        timing = soak.run()
        result = soak.check()
    report = {"kills": soak.kills, "runs_started": soak.started, "resumes_killed_or_not": soak.resumes,
              "starts_killed_before_a_run_existed": soak.starts_killed_before_a_run, **timing, **result,
              "lost_or_duplicated_trials": sum("trials, budget" in p or "twice" in p for p in result["problems"]),
              "kill_moments_s": {"min": min(soak.kill_moments, default=None),
                                 "max": max(soak.kill_moments, default=None)}}
    print(json.dumps(report, indent=2))
    return 0 if not result["problems"] and all(rc == 0 for rc in timing["final_resumes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
