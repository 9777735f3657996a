"""Reading a verl run's console output: metric lines (a fallback to the JSONL file) and failure causes.

verl's console logger prints one line per step, ``step:N - key:value - key:value``, with numpy values
shown as ``np.float64(1.5)``; under Ray the line may carry a ``(TaskRunnerV1 pid=...)`` prefix and colour
codes (unless ``RAY_COLOR_PREFIX=0``). Failures are recognised from the log text plus the exit code.
"""

from __future__ import annotations

import math
import os
import re
import signal
from dataclasses import dataclass

from mart.state.metrics import StepRecord, parse_line
from mart.state.models import TrialStatus
from mart.trial_runner.metrics import MetricsTail

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX_RE = re.compile(r"^\s*\([^()]*\bpid=\d+[^()]*\)\s*")
_RANK_PREFIX_RE = re.compile(r"^\[(?:default)?rank\d+\]:\s*")  # torch.distributed / torchrun tag each worker's lines
# the step token may follow a tqdm fragment (``...it/s]step:3 - ...``: verl's progress bar writes no newline);
# never a longer key ending in "step" (``training/global_step:3``)
_STEP_RE = re.compile(r"(?<![\w./-])step:(\d+)(?=\s+-\s|\s*$)")
_WRAPPED_RE = re.compile(r"^(?:np\.|numpy\.|torch\.)?[A-Za-z_][A-Za-z0-9_]*\((.*)\)$")


def strip_prefixes(line: str) -> str:
    """Remove ANSI colour codes, Ray's ``(Actor pid=N, ip=...)`` prefix and torch's ``[rank0]:`` tag."""
    return _RANK_PREFIX_RE.sub("", _RAY_PREFIX_RE.sub("", _ANSI_RE.sub("", line))).rstrip("\r\n")


def _unwrap(text: str) -> str:
    text = text.strip()
    m = _WRAPPED_RE.match(text)
    return m.group(1).split(",")[0].strip() if m else text


def parse_console_value(text: str) -> float:
    """``1.5``, ``np.float64(1.5)``, ``np.int64(3)``, ``tensor(0.5, device='cuda:0')``, ``nan``, ``True`` -> float
    (NaN if not a number). ``inf`` reads as NaN, as verl's file logger writes it (``null``): both routes agree."""
    raw = _unwrap(text)
    if raw in ("True", "False"):
        return float(raw == "True")
    try:
        value = float(raw)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def parse_console_line(line: str) -> StepRecord | None:
    """Parse verl's ``step:N - key:value ...`` console line (or a JSONL record echoed to the log)."""
    text = strip_prefixes(line).strip()
    if text.startswith("{"):
        return parse_line(text)
    m = _STEP_RE.search(text)
    if not m:
        return None
    data: dict[str, float] = {}
    for part in text[m.end():].split(" - "):
        key, sep, value = part.strip().partition(":")
        if not sep or not key:
            continue
        num = parse_console_value(value)
        if math.isnan(num) and _unwrap(value).lower() not in ("nan", "none", "null", "inf", "-inf"):
            continue  # not a number (a string or a list): not a metric
        data[key.strip()] = num
    return StepRecord(step=int(m.group(1)), data=data)


class ConsoleMetricsTail(MetricsTail):
    """Incremental reader of metric lines in a log file (complete lines only), like ``MetricsTail``."""

    def __init__(self, path: str | os.PathLike, offset: int = 0) -> None:
        super().__init__(path, offset, parse=parse_console_line)


class FallbackMetricsTail:
    """verl's JSONL file when it exists, else the console lines of the trial log.

    Decides on each call until the JSONL file appears, then sticks to it (the file is the better source:
    it has every key and null for NaN). Records already returned from the log are not repeated.
    """

    def __init__(self, jsonl_path: str | os.PathLike, log_path: str | os.PathLike, log_offset: int = 0) -> None:
        self.jsonl = MetricsTail(jsonl_path)
        self.console = ConsoleMetricsTail(log_path, log_offset)
        self._last_step = -1
        self._using_file = False

    @property
    def source(self) -> str:
        return "jsonl" if self._using_file else "console"

    def read_new(self, final: bool = False) -> list[StepRecord]:
        """New records, each step once (a step number seen again, e.g. a line echoed twice, is dropped).

        ``final``: the run has exited, so a last line without a newline is read too.
        """
        if self._using_file or self.jsonl.path.exists():
            self._using_file = True
            raw = self.jsonl.read_new(final=final)
        else:
            raw = self.console.read_new(final=final)
        recs = []
        for r in raw:
            if r.step > self._last_step:
                recs.append(r)
                self._last_step = r.step
        return recs


# --------------------------------------------------------------------------------------------- failures

#: (regex, reason) pairs that mean the trial ran out of memory (GPU, KV cache, or host).
OOM_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError"), "torch OutOfMemoryError (GPU memory)"),
    (re.compile(r"CUDA out of memory"), "CUDA out of memory"),
    (re.compile(r"CUDA error: out of memory"), "CUDA error: out of memory"),
    (re.compile(r"HIP out of memory|NPU out of memory"), "accelerator out of memory"),
    (re.compile(r"No available memory for the cache blocks"), "vLLM: no memory left for the KV cache"),
    (re.compile(r"larger than the maximum number of tokens that can be stored in KV cache"),
     "vLLM: KV cache too small for max_model_len"),
    (re.compile(r"KV cache is needed, which is larger than the available KV cache memory"),
     "vLLM: KV cache too small for max_model_len"),
    (re.compile(r"Free memory on device .{0,80}is less than desired GPU memory utilization"),
     "vLLM: not enough free GPU memory at startup (gpu_memory_utilization too high or memory still held)"),
    (re.compile(r"node running low on memory|ray\.exceptions\.OutOfMemoryError"), "host memory (Ray's OOM killer)"),
]

_ERROR_LINE_RE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$")


def find_oom(text: str) -> str | None:
    """The reason of the first OOM pattern found in ``text``, or None."""
    for pattern, reason in OOM_PATTERNS:
        m = pattern.search(text)
        if m:
            line_start = text.rfind("\n", 0, m.start()) + 1
            line_end = text.find("\n", m.end())
            line = strip_prefixes(text[line_start: line_end if line_end >= 0 else len(text)]).strip()
            return f"{reason}: {line[:300]}" if line else reason
    return None


def last_error_line(text: str) -> str | None:
    """The last ``SomethingError: message`` line of a log (what a traceback ends with)."""
    found = None
    for raw in text.splitlines():
        m = _ERROR_LINE_RE.match(strip_prefixes(raw))
        if m:
            found = m.group(1).strip()
    return found[:500] if found else None


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exit code unknown"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode > 128:
        try:
            return f"exit code {returncode} ({signal.Signals(returncode - 128).name})"
        except ValueError:
            pass
    return f"exit code {returncode}"


@dataclass
class Outcome:
    status: TrialStatus
    reason: str | None


def classify_exit(returncode: int | None, log_text: str, last_step: int | None, horizon: int | None) -> Outcome:
    """Final status of an ended run from its exit code, its log and how far it got.

    A run that exited 0 with every step logged completed, whatever its log says. Otherwise OOM text wins
    (verl often exits 1, or hangs, after a worker's OOM). Exit 0 short of the horizon is a failure too:
    verl leaves its loop silently when ``trainer.total_epochs`` runs out.
    """
    done = last_step if last_step is not None else 0
    if returncode == 0 and (horizon is None or done >= horizon):
        return Outcome(TrialStatus.COMPLETED, None)
    oom = find_oom(log_text)
    if oom:
        return Outcome(TrialStatus.OOM, oom)
    if returncode == 0:
        if horizon is not None and done < horizon:
            return Outcome(TrialStatus.FAILED, f"exited 0 after step {done} of {horizon} (trainer.total_epochs or "
                                              "the dataset too small for the horizon?)")
        return Outcome(TrialStatus.COMPLETED, None)
    if returncode is None and horizon is not None and done >= horizon:
        return Outcome(TrialStatus.COMPLETED, "exit code unknown; all steps logged")
    err = last_error_line(log_text)
    exit_text = describe_exit(returncode)
    return Outcome(TrialStatus.FAILED, f"{exit_text}: {err}" if err else f"crashed ({exit_text}) after step {done}")


def read_tail(path: str | os.PathLike, offset: int = 0, max_bytes: int = 512 * 1024) -> str:
    """The last ``max_bytes`` of a file from ``offset`` on (decoded leniently; '' when absent)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(offset, size - max_bytes)
            f.seek(start)
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
