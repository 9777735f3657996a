"""The processes of real verl trials (found by mart's marker), and the ``mart`` command line in this venv."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil


def marked_processes(root: Path) -> list[psutil.Process]:
    """Live processes of any trial under ``root`` (mart marks each trial's processes with its folder)."""
    root_s = str(Path(root).resolve())
    out = []
    for p in psutil.process_iter():
        try:
            d = p.environ().get("MART_TRIAL_DIR", "")
            if d.startswith(root_s) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def wait_gone(root: Path, timeout: float) -> list[str]:
    """Wait up to ``timeout`` s for every process of the trials under ``root`` to end; what is still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = marked_processes(root)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = []
    for p in left:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return out


def mart_cmd(*args: str) -> list[str]:
    """``mart`` in this interpreter's venv."""
    return [sys.executable, "-m", "mart.graph.cli", *args]


ENV_FOR_MART = {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"}


def mart_env() -> dict[str, str]:
    return {**os.environ, **ENV_FOR_MART}


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
