"""A thin parent for a trial's process: records its exit code (and sampled GPU memory peaks) in files.

``python -m mart.trial_runner.verl.supervise --exit-file F [--gpu-peaks-file G] -- CMD ARGS...``

With ``G``, the GPU memory peaks so far are rewritten every ``--write-s`` seconds during the run (and once
at the end), with what each GPU held before launch.

The runner starts this as the leader of a new process group; the command inherits the group, the working
directory, the environment and the output. The tuner can crash and come back: the exit code is then read
from ``F`` (``{"returncode": int, "ended_at": float}``) instead of from a ``wait`` it can no longer do. ``F`` also
holds this process's launch token, pid and create time (``"launch"``), so that a tuner killed before it saved
the pid still finds this run's ending (``VerlRunner.adopt``).
SIGTERM/SIGINT sent to the group reach the command directly; this process ignores them and waits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def _write_json(path: str, data: dict) -> None:
    from mart.state.files import write_atomic

    write_atomic(os.path.dirname(path) or ".", os.path.basename(path), json.dumps(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mart.trial_runner.verl.supervise")
    parser.add_argument("--exit-file", required=True)
    parser.add_argument("--gpu-peaks-file", default=None)
    parser.add_argument("--sample-s", type=float, default=1.0)
    parser.add_argument("--write-s", type=float, default=5.0, help="write the peaks so far this often")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("no command given after --")

    # the group's SIGTERM/SIGINT are for the command; this process waits for it. A Python handler (unlike
    # SIG_IGN) is not inherited across exec, so the command keeps the default dispositions.
    signal.signal(signal.SIGTERM, _note_signal)
    signal.signal(signal.SIGINT, _note_signal)
    started = time.time()
    from mart.trial_runner.process import launch_record

    launch = launch_record()
    sampler = None
    if args.gpu_peaks_file:
        from mart.trial_runner.gpu import PeakSampler

        sampler = PeakSampler(args.sample_s)
        sampler.sample_once()  # what other processes hold before launch (subtracted from the job's peak)
    try:
        proc = subprocess.Popen(cmd)
    except OSError as e:
        print(f"mart: cannot start {cmd[0]!r}: {e}", file=sys.stderr, flush=True)
        _write_json(args.exit_file, {"returncode": 127, "ended_at": time.time(), "error": str(e)})
        return 127

    if sampler is not None:
        sampler.start()
    while True:
        try:
            rc = proc.wait(timeout=args.write_s if sampler is not None else None)
            break
        except subprocess.TimeoutExpired:
            # the peaks so far, for the runner to judge the memory margin while the run goes on
            _write_peaks(args.gpu_peaks_file, sampler, final=False)
    result: dict = {"returncode": rc, "started_at": started, "ended_at": time.time()}
    if launch is not None:
        result["launch"] = launch
    if sampler is not None:
        sampler.stop()
        _write_peaks(args.gpu_peaks_file, sampler, final=True)
    _write_json(args.exit_file, result)
    return rc if rc >= 0 else 128 - rc


def _write_peaks(path: str, sampler, final: bool) -> None:
    if not sampler.peaks_gb:
        return
    _write_json(path, {"peaks_gb": {str(k): v for k, v in sampler.peaks_gb.items()},
                       "before_gb": {str(k): v for k, v in (sampler.before_gb or {}).items()},
                       "max_peak_gb": sampler.max_peak_gb, "samples": sampler.samples, "final": final})


def _note_signal(signum: int, frame: object) -> None:
    """Keep waiting for the command (it got the same signal from the process group)."""


if __name__ == "__main__":
    sys.exit(main())
