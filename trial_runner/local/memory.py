"""Peak memory of a step, and the emulated memory capacity (GPU memory on a CPU box).

On CUDA the numbers are ``torch.cuda.max_memory_allocated``. On the CPU they are the process's peak
resident memory during the step (Linux's exact high-water mark ``VmHWM``, reset at each step through
``/proc/self/clear_refs``; elsewhere a 10 ms sampler of ``RssAnon``) less its file-backed pages
(library code) and less the anonymous memory it held after its imports: what the workload itself
holds (weights, optimizer state, KV cache, activations), the CPU analogue of what
``max_memory_allocated`` counts on a GPU, and comparable between machines. glibc is made to hand
freed memory back to the OS: tensors of 256 KiB and more live in their own mappings (``mallopt``),
and the heap is trimmed before each step (``malloc_trim``), so the peak follows live tensors (and
gradient checkpointing saves memory here as it does on a GPU).

A watchdog thread compares the peak with the capacity every 10 ms and interrupts the main thread as
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


MMAP_THRESHOLD = 256 * 1024
_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None and sys.platform.startswith("linux"):
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            _LIBC = False
    return _LIBC or None


def tune_malloc() -> None:
    """Make glibc serve tensors of ``MMAP_THRESHOLD`` bytes and more from their own mappings, which
    go back to the OS when freed, so resident memory follows live tensors (as a GPU's allocated
    memory does) instead of keeping every freed activation in the heap. It costs some page faults:
    ~20% on the largest micro-batches, nothing on small ones. No-op off glibc."""
    libc = _libc()
    if libc is not None:
        try:
            libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (fixed: no dynamic raising)
        except AttributeError:
            pass


def release_free_memory() -> None:
    """Hand the allocator's free pages back to the OS (glibc ``malloc_trim``), so the next step's
    peak starts from live memory, not from what earlier steps freed. No-op off glibc."""
    libc = _libc()
    if libc is not None:
        try:
            libc.malloc_trim(0)
        except AttributeError:
            pass


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


def _anon_bytes(st: dict[str, int]) -> int:
    """Resident memory that is not file-backed (code pages of libraries are not the workload's)."""
    if "RssAnon" in st:
        return st["RssAnon"]
    if "VmRSS" in st:
        return st["VmRSS"]
    import psutil

    return psutil.Process().memory_info().rss


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    st = _status()
    return "VmHWM" in st and "RssFile" in st


def available_host_bytes() -> int:
    import psutil

    return psutil.virtual_memory().available


class MemoryMonitor:
    """Tracks the per-step peak and enforces the capacity.

    Args:
        capacity_gb: emulated device memory; a step peak above it ends the trial as ``oom``.
        device: ``cpu`` or ``cuda``.
    """

    def __init__(self, capacity_gb: float | None, device: str = "cpu", poll_s: float = 0.01) -> None:
        self.capacity_gb = capacity_gb
        self.cuda = device == "cuda"
        self.poll_s = poll_s
        self.baseline = 0 if self.cuda else _anon_bytes(_status())
        self.host_limit = None if self.cuda else self.baseline + int(0.8 * available_host_bytes())
        self.phase = "setup"
        self.tripped: str | None = None
        self._hwm = not self.cuda and _reset_hwm()
        self._sampled_peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- measurement -------------------------------------------------------------------------------
    def reset_peak(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        else:
            release_free_memory()
            if self._hwm:
                _reset_hwm()
        self._sampled_peak = 0 if self.cuda else _anon_bytes(_status())

    def _peak_bytes(self) -> int:
        """Peak anonymous memory since the reset: the exact high-water mark less the file-backed pages
        (which only grow as library code is paged in), or the sampled maximum without ``VmHWM``."""
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated()
        st = _status()
        if self._hwm:
            return st["VmHWM"] - st["RssFile"] - st.get("RssShmem", 0)
        self._sampled_peak = max(self._sampled_peak, _anon_bytes(st))
        return self._sampled_peak

    def peak_gb(self) -> float:
        """Peak workload memory since the last ``reset_peak`` (GB)."""
        return max(0, self._peak_bytes() - self.baseline) / GB

    def used_gb(self) -> float:
        """Resident memory of the whole process now (GB; verl's ``perf/cpu_memory_used_gb``)."""
        st = _status()
        return st["VmRSS"] / GB if "VmRSS" in st else _anon_bytes(st) / GB

    # --- enforcement -------------------------------------------------------------------------------
    def _over(self) -> str | None:
        peak = self._peak_bytes()
        if self.capacity_gb is not None and peak - self.baseline > self.capacity_gb * GB:
            return (f"peak memory {(peak - self.baseline) / GB:.3f} GB exceeded the capacity "
                    f"{self.capacity_gb:g} GB during {self.phase}")
        if self.host_limit is not None and peak > self.host_limit:
            return f"process memory {peak / GB:.2f} GB exceeded 80% of the host's available memory during {self.phase}"
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

