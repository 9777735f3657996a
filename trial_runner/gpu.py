"""GPU probe through NVML (``pynvml`` from the ``nvidia-ml-py`` package; the ``gpu`` extra).

Everything here degrades to "no GPU" instead of raising: no ``pynvml`` module, no driver, no device
all give ``probe() == []``, a sampler that records nothing, and ``wait_gpu_memory_free`` returning True.

    >>> from mart.trial_runner.gpu import probe, memory_capacity_gb
    >>> gpus = probe()            # [] on a CPU-only machine
    >>> memory_capacity_gb()      # per-GPU total of the smallest GPU, or None
"""

from __future__ import annotations

import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from mart.trial_runner.ray.cluster import RayJobSizing

GIB = 1024**3


@dataclass(frozen=True)
class GpuInfo:
    """One GPU's memory as NVML reports it (GiB; ``used`` includes every process on the device)."""

    index: int
    name: str
    total_gb: float
    used_gb: float
    free_gb: float
    uuid: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextmanager
def _nvml() -> Iterator[Any | None]:
    """The initialised ``pynvml`` module (shut down on exit), or None when NVML is unavailable."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... : no GPU here
        yield None
        return
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_filter(env: dict[str, str] | None = None):
    """A predicate ``(index, uuid) -> bool`` for the GPUs ``CUDA_VISIBLE_DEVICES`` lets this process use.

    NVML ignores ``CUDA_VISIBLE_DEVICES`` and lists every GPU of the node, so mart filters: unset = all;
    a list of indices (``0,2``) or UUIDs / unique UUID prefixes (``GPU-8f3a...``, ``MIG-...``); CUDA stops at
    the first invalid entry, and so does this; empty or ``-1`` = none.
    """
    import os

    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return lambda index, uuid: True
    entries: list[str] = []
    for tok in (t.strip() for t in raw.split(",")):
        if not tok or tok.startswith("-") or not (tok.isdigit() or tok.upper().startswith(("GPU-", "MIG-"))):
            break
        entries.append(tok)

    def visible(index: int, uuid: str) -> bool:
        for tok in entries:
            if tok.isdigit() and int(tok) == index:
                return True
            if not tok.isdigit() and uuid and uuid.upper().startswith(tok.upper()):
                return True
        return False

    return visible


def probe(all_devices: bool = False, env: dict[str, str] | None = None) -> list[GpuInfo]:
    """GPU count and total/used/free memory per GPU this process (or ``env``'s ``CUDA_VISIBLE_DEVICES``) may use;
    every GPU of the node with ``all_devices``; ``[]`` where there is no driver or device."""
    out: list[GpuInfo] = []
    visible = (lambda index, uuid: True) if all_devices else visible_filter(env)
    with _nvml() as nv:
        if nv is None:
            return out
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                try:
                    uuid = _text(nv.nvmlDeviceGetUUID(h))
                except Exception:
                    uuid = ""
                if not visible(i, uuid):
                    continue
                out.append(GpuInfo(i, _text(nv.nvmlDeviceGetName(h)), mem.total / GIB, mem.used / GIB,
                                   mem.free / GIB, uuid))
        except Exception:
            pass  # a device that fails mid-probe: report the ones read so far
    return out


def memory_capacity_gb(gpus: list[GpuInfo] | None = None) -> float | None:
    """Per-GPU memory the margin rule uses: the smallest GPU's total (None without GPUs)."""
    gpus = probe() if gpus is None else gpus
    return min(g.total_gb for g in gpus) if gpus else None


def used_memory_gb(env: dict[str, str] | None = None) -> dict[int, float]:
    """Used memory per GPU index right now (empty without GPUs); ``env``: whose ``CUDA_VISIBLE_DEVICES``."""
    return {g.index: g.used_gb for g in probe(env=env)}


class PeakSampler:
    """Background thread sampling used GPU memory; ``peaks_gb`` holds the maximum seen per GPU.

    Used memory is device-wide (vLLM's KV cache and every worker count, which one process's torch peak
    misses); ``before_gb`` is what the GPUs held when sampling started (other processes), which the job's
    peak subtracts (``trial_runner.verl.runner.job_peak_gb``).

        with PeakSampler(interval_s=1.0) as s:
            ...  # run the trial
        s.peaks_gb, s.max_peak_gb
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"`interval_s > 0` must hold, but got {interval_s=}.")
        self.interval_s = interval_s
        self.peaks_gb: dict[int, float] = {}
        self.before_gb: dict[int, float] | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def max_peak_gb(self) -> float | None:
        return max(self.peaks_gb.values()) if self.peaks_gb else None

    def sample_once(self) -> None:
        used_now = used_memory_gb()
        if self.before_gb is None:
            self.before_gb = dict(used_now)
        for idx, used in used_now.items():
            self.peaks_gb[idx] = max(self.peaks_gb.get(idx, 0.0), used)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            if not self.peaks_gb:  # no GPU: nothing to sample, stop at once
                return
            self._stop.wait(self.interval_s)

    def start(self) -> PeakSampler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpu-peak-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> dict[int, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 1)
        return dict(self.peaks_gb)

    def __enter__(self) -> PeakSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_gpu_memory_free(threshold_gb: float = 1.0, timeout_s: float = 60.0, poll_s: float = 1.0,
                         env: dict[str, str] | None = None) -> bool:
    """Wait until every GPU (of ``env``'s ``CUDA_VISIBLE_DEVICES``: a trial's slot) uses at most ``threshold_gb``;
    True at once without GPUs, False on timeout.

    Call it before the next trial: vLLM workers of a stopped run can keep GPU memory for a while.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        used = used_memory_gb(env)
        if all(u <= threshold_gb for u in used.values()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def gpu_processes(env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Processes holding memory on the visible GPUs (pid, gpu index, used GiB); [] without GPUs."""
    out: list[dict[str, Any]] = []
    visible = visible_filter(env)
    with _nvml() as nv:
        if nv is None:
            return out
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                try:
                    uuid = _text(nv.nvmlDeviceGetUUID(h))
                except Exception:
                    uuid = ""
                if not visible(i, uuid):
                    continue
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    used = getattr(p, "usedGpuMemory", None)
                    out.append({"gpu": i, "pid": p.pid, "used_gb": (used or 0) / GIB})
        except Exception:
            pass
    return out


def main() -> None:  # pragma: no cover - exercised by scripts/gpu_check.sh
    """``python -m mart.trial_runner.gpu``: print the probe as JSON (one object per GPU)."""
    import json

    gpus = probe()
    import os

    print(json.dumps({"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "gpus_on_node": len(probe(all_devices=True)), "gpu_count": len(gpus),
                      "gpus": [g.to_dict() for g in gpus],
                      "memory_capacity_gb": memory_capacity_gb(gpus), "processes": gpu_processes()}, indent=2))


if __name__ == "__main__":  # pragma: no cover
    main()


class GpuBackendCapacity(RayJobSizing):
    """``memory_capacity_gb``, the GPU probe and the trial slots of a backend whose trials run on GPUs here or on a
    Ray cluster (verl, MARTI). Expects ``name``, ``ray_address``, ``_memory_capacity_gb`` and ``base_config`` on the
    backend, which calls ``_init_ray_sizing`` (its ``entrypoint_*`` options: by default the driver reserves nothing,
    its trainer asks Ray for the GPUs) and may override ``_ray_gpu_groups`` (default: verl's
    ``trainer.nnodes`` groups of ``trainer.n_gpus_per_node``, each on one node)."""

    name: str
    ray_address: str | None
    _memory_capacity_gb: float | None
    _gpus: list | None = None
    _warned_no_capacity = False

    def _probe(self) -> list:
        if self._gpus is None:
            self._gpus = probe()
        return self._gpus

    def max_parallel_trials(self) -> int | None:
        """Trials that fit at once: on this machine, the visible GPUs over the GPUs one trial uses (at least one
        trial); on a Ray cluster, its GPU nodes over one trial's GPU groups (and its driver's reservation)."""
        if self.ray_address is not None:
            return self._ray_slots()
        per_trial = self._gpus_per_trial()
        return max(1, len(self._probe()) // per_trial) if self._probe() else 1

    def trial_devices(self, slot: int) -> str | None:
        """Slot k's own block of GPUs here (the k-th ``per trial`` of the visible ones), by UUID: CUDA numbers
        devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML by PCI bus, so an index could name
        another trial's GPU. None on a Ray cluster (Ray gives each job its GPUs) or when only one trial fits."""
        if self.ray_address is not None:
            return None
        gpus, per = self._probe(), self._gpus_per_trial()
        if len(gpus) < 2 * per:
            return None
        block = gpus[(slot % (len(gpus) // per)) * per:][:per]
        return ",".join(g.uuid or str(g.index) for g in block)

    def parallel_limit_reason(self) -> str:
        if self.ray_address is not None:
            return self._ray_slots_reason()
        n = len(self._probe())
        return (f"{n} GPU(s) visible here, {self._gpus_per_trial()} per trial" if n else
                "no GPU is visible here: one trial at a time")

    def _ray_gpu_groups(self) -> tuple[int, int, bool]:
        base = self.base_config() if hasattr(self, "base_config") else {}
        try:
            return max(1, int(base.get("trainer.nnodes", 1))), max(1, int(base.get("trainer.n_gpus_per_node", 1))), True
        except (TypeError, ValueError):
            return 1, 1, True

    def _gpus_per_trial(self) -> int:
        groups, per_group, _ = self._ray_gpu_groups()
        return max(1, groups * per_group)

    def memory_capacity_gb(self) -> float | None:
        """Per-GPU total from NVML when GPUs are present here (and trials run here), else the configured value.

        None (the margin rule is off) is said out loud once: on a Ray cluster without ``--memory-capacity-gb``
        the tuner sees no GPU.
        """
        if self.ray_address is None:
            cap = memory_capacity_gb(self._probe())
            if cap is not None:
                return cap
        if self._memory_capacity_gb is None and not self._warned_no_capacity:
            self._warned_no_capacity = True
            where = "the trials run on a Ray cluster" if self.ray_address else "no GPU is visible here"
            warnings.warn(f"{self.name} backend: the memory margin rule is OFF: {where} and no "
                          "--memory-capacity-gb was given (per-GPU memory in GB)", stacklevel=2)
        return self._memory_capacity_gb
