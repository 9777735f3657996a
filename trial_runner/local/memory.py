"""Peak memory of a step, and the emulated memory capacity (GPU memory on a CPU box).

On CUDA the numbers are ``torch.cuda.max_memory_allocated``. On the CPU they are the process's live
heap memory (glibc's ``mallinfo2``: bytes handed out by ``malloc`` and not yet freed, which is where
torch's CPU tensors live) less what the process held after its imports: the memory the workload
itself holds (weights, optimizer state, KV cache, activations), the CPU analogue of what
``max_memory_allocated`` counts on a GPU (freed activations do not count, so gradient checkpointing
saves memory here as it does there), comparable between machines. The peak is sampled every 5 ms by
a watchdog thread and at probe points in the step (after each forward, where activations peak).
Without ``mallinfo2`` (not glibc) the process's resident memory is sampled instead.

The watchdog compares the peak with the capacity at each sample and interrupts the main thread as
soon as it is exceeded (``MemoryCapacityExceeded``), long before the host's OOM killer could act; a
hard limit at 80% of the host's available memory applies even without a capacity.
"""

from __future__ import annotations

import _thread
import ctypes
import ctypes.util
import signal
import sys
import threading

GB = 1024**3
_INTERRUPT_SIGNAL = getattr(signal, "SIGUSR1", signal.SIGINT)


class MemoryCapacityExceeded(Exception):
    """The step's peak memory went over the (emulated) capacity."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    """glibc's ``mallinfo2`` (2.33+), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2 = _mallinfo2()


def heap_bytes() -> int | None:
    """Bytes allocated by malloc and not yet freed (all arenas plus mmapped blocks), or None."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return info.uordblks + info.hblkhd


def _status() -> dict[str, int]:
    """Memory fields of /proc/self/status in bytes (empty where there is no procfs)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("Vm", "Rss")):
                    name, _, rest = line.partition(":")
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        out[name] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def rss_bytes() -> int:
    st = _status()
    if "VmRSS" in st:
        return st["VmRSS"]
    import psutil

    return psutil.Process().memory_info().rss


def _anon_bytes() -> int:
    st = _status()
    return st.get("RssAnon", st.get("VmRSS", 0)) or rss_bytes()


def available_host_bytes() -> int:
    import psutil

    return psutil.virtual_memory().available


class MemoryMonitor:
    """Tracks the per-step peak and enforces the capacity.

    Args:
        capacity_gb: emulated device memory; a peak above it ends the trial as ``oom``.
        device: ``cpu`` or ``cuda``.
        poll_s: the watchdog's sampling interval.
    """

    def __init__(self, capacity_gb: float | None, device: str = "cpu", poll_s: float = 0.005) -> None:
        self.capacity_gb = capacity_gb
        self.cuda = device == "cuda"
        self.poll_s = poll_s
        self.heap = not self.cuda and heap_bytes() is not None
        self.baseline = 0 if self.cuda else self._now()
        self.host_limit = None if self.cuda else rss_bytes() + int(0.8 * available_host_bytes())
        self.phase = "setup"
        self.tripped: str | None = None
        self._peak = self.baseline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- measurement -------------------------------------------------------------------------------
    def _now(self) -> int:
        if self.heap:
            return heap_bytes() or 0
        return _anon_bytes()

    def sample(self) -> int:
        """Take a sample now (probe points call this); returns the peak so far in bytes."""
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated()
        now = self._now()
        self._peak = max(self._peak, now)
        return self._peak

    def reset_peak(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        else:
            self._peak = self._now()

    def peak_gb(self) -> float:
        """Peak workload memory since the last ``reset_peak`` (GB)."""
        return max(0, self.sample() - self.baseline) / GB

    def used_gb(self) -> float:
        """Resident memory of the whole process now (GB; verl's ``perf/cpu_memory_used_gb``)."""
        return rss_bytes() / GB

    # --- enforcement -------------------------------------------------------------------------------
    def _over(self) -> str | None:
        peak = self.sample() - self.baseline
        if self.capacity_gb is not None and peak > self.capacity_gb * GB:
            return f"peak memory {peak / GB:.3f} GB exceeded the capacity {self.capacity_gb:g} GB during {self.phase}"
        if self.host_limit is not None:
            rss = rss_bytes()
            if rss > self.host_limit:
                return f"process memory {rss / GB:.2f} GB exceeded 80% of the host's available memory during {self.phase}"
        return None

    def enter(self, phase: str) -> None:
        """Name what runs now (for the message when the capacity is exceeded)."""
        self.phase = phase

    def check(self, *_: object) -> None:
        """Raise ``MemoryCapacityExceeded`` if the peak so far is over the capacity."""
        msg = self.tripped or self._over()
        if msg:
            self.tripped = msg
            raise MemoryCapacityExceeded(msg)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            msg = self._over()
            if msg and self.tripped is None:
                self.tripped = msg
                _thread.interrupt_main(_INTERRUPT_SIGNAL)
                return

    def start(self) -> None:
        """Start the watchdog; the main thread gets ``MemoryCapacityExceeded`` when it trips."""

        def on_signal(signum, frame):
            if self.tripped:
                raise MemoryCapacityExceeded(self.tripped)

        if threading.current_thread() is threading.main_thread():
            signal.signal(_INTERRUPT_SIGNAL, on_signal)
        self._thread = threading.Thread(target=self._watch, name="mart-memory-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def static_agent_gb(cfg) -> float:
    """One policy's static memory (GB): fp32 weights, gradients and AdamW's two moments, plus the frozen
    reference's weights with use_kl_loss (4 + 4 + 8 (+ 4) bytes a parameter). A multi-agent trial holds
    one such set per agent; its activation peak is one agent's (they run one after another)."""
    from mart.trial_runner.local.grpo import model_config
    from mart.trial_runner.local.model import GPT

    n_params = sum(p.numel() for p in GPT(model_config(cfg)).parameters())
    return n_params * (16 + (4 if cfg.use_kl_loss else 0)) / GB
