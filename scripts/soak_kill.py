"""Soak: ``kill -9`` the tuner at random moments of ``mart tune`` on the local workload, then ``mart resume``.

Each cycle starts (or resumes) a run, lets it go for a random time, and kills the driver with SIGKILL
(its trials live in their own process groups and are re-attached on resume). After ``--kills`` kills,
every run is resumed to the end without kills, and each is checked:

- the run completed and its trial count is exactly the budget (no lost trial, no extra one);
- no candidate ran twice, no trial is left ``running``, every trial's metric steps are 1..n without gaps;
- no trial ran twice at the OS level: each trial's log shows one trainer start, and no two trainer processes
  of the same trial were ever seen alive at once (sampled while the runs go);
- no trial process is left alive.

``--launch-window-share F`` makes that share of the kills land inside the launch window: the driver is killed
the moment a new trial's ``trial.log`` appears, before its handle can reach the ledger. ``--parallel N`` runs
the sessions with N trials at once.

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
        self.window_kills = 0
        self.twins: dict[str, int] = {}  # trial dir -> most trainer processes seen alive at once

    def mart(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "mart.graph.cli", *argv]

    def tune_cmd(self) -> list[str]:
        a = self.args
        return self.mart("tune", "--backend", "local", "--base-config", str(self.config), "--approve", "auto",
                         "--system-trials", str(a.system_trials), "--learning-trials", str(a.learning_trials),
                         "--system-horizon", str(a.system_horizon), "--learning-horizon", str(a.learning_horizon),
                         "--parallel", str(a.parallel), "--runs-dir", str(self.runs), "--quiet", "--json")

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
        # spread evenly rather than drawn: that share of the kills so far lands in the launch window (a draw can
        # miss the window in every kill of a short soak)
        in_window = self.window_kills < self.args.launch_window_share * (self.kills + 1)
        try:
            if in_window and run is not None:
                self.wait_for_a_launch(proc, run, delay)
            else:
                self.sample_while(proc, delay)
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[3:5])} failed ({proc.returncode}): {err.decode()[-2000:]}")
            return False, run or next(iter(self.run_ids() - before), None)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            proc.communicate()
            self.kills += 1
            self.window_kills += int(in_window)
            self.kill_moments.append(round(delay, 2))
            if run is None:
                run = next(iter(self.run_ids() - before), None)
            return True, run

    def sample_while(self, proc: subprocess.Popen, seconds: float) -> None:
        """Wait up to ``seconds`` for ``proc``, sampling the trainer processes; TimeoutExpired if it still runs."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sample_trainers()
            try:
                proc.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                continue
        raise subprocess.TimeoutExpired(proc.args, seconds)

    def wait_for_a_launch(self, proc: subprocess.Popen, run: str, seconds: float) -> None:
        """Kill-worthy moment: a new trial's log appears (the trainer is being spawned, its handle not saved)."""
        trials = self.runs / run / "trials"
        seen = {p.parent for p in trials.glob("*/trial.log")}
        deadline = time.monotonic() + max(seconds, 30.0)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            if {p.parent for p in trials.glob("*/trial.log")} - seen:
                raise subprocess.TimeoutExpired(proc.args, seconds)
            time.sleep(0.002)
        raise subprocess.TimeoutExpired(proc.args, seconds)

    def sample_trainers(self) -> None:
        """Count the live trainer processes of each trial directory (two at once = a trial run twice)."""
        try:
            import psutil
        except ImportError:
            return
        count: dict[str, int] = {}
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = p.info.get("cmdline") or []
            if "mart.trial_runner.local" in cmd and "--out" in cmd:
                out = cmd[cmd.index("--out") + 1] if cmd.index("--out") + 1 < len(cmd) else ""
                if str(self.runs) in out:
                    count[out] = count.get(out, 0) + 1
        for out, n in count.items():
            self.twins[out] = max(self.twins.get(out, 0), n)

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
                log = self.runs / run / "trials" / trial_id / "trial.log"
                starts = sum(line.startswith("local GRPO trial:") for line in log.read_text(errors="replace").splitlines()) \
                    if log.exists() else 0
                if starts > 1:
                    problems.append(f"{run}/{trial_id}: the trainer started {starts} times")
                steps = [s for (s,) in query(db, "SELECT DISTINCT step FROM metrics WHERE trial_id=? ORDER BY step",
                                            (trial_id,))]
                if steps and steps != list(range(steps[0], steps[0] + len(steps))):
                    problems.append(f"{run}/{trial_id}: metric steps with gaps {steps}")
        leftover = self.leftover_trials()
        if leftover:
            problems.append(f"trial processes still alive: {leftover}")
        twice = sorted(out for out, n in self.twins.items() if n > 1)
        if twice:
            problems.append(f"two trainer processes of one trial alive at once: {twice}")
        return {"runs": len(runs), "trials": trials_total, "confirm_trials": confirm_total, "problems": problems,
                "most_trainers_per_trial": max(self.twins.values(), default=0)}

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
    ap.add_argument("--parallel", type=int, default=1, help="trials at once in each session (mart tune --parallel)")
    ap.add_argument("--launch-window-share", type=float, default=0.3,
                    help="share of the kills made the moment a new trial's log appears (inside the launch window)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mart-soak-") as tmp:
        work = args.workdir or Path(tmp)
        soak = Soak(args, work)
        timing = soak.run()
        result = soak.check()
    report = {"kills": soak.kills, "kills_in_the_launch_window": soak.window_kills, "parallel": args.parallel,
              "runs_started": soak.started, "resumes_killed_or_not": soak.resumes,
              "starts_killed_before_a_run_existed": soak.starts_killed_before_a_run, **timing, **result,
              "lost_or_duplicated_trials": sum("trials, budget" in p or "twice" in p for p in result["problems"]),
              "kill_moments_s": {"min": min(soak.kill_moments, default=None),
                                 "max": max(soak.kill_moments, default=None)}}
    print(json.dumps(report, indent=2))
    return 0 if not result["problems"] and all(rc == 0 for rc in timing["final_resumes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
