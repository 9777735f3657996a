"""A CPU platform for real, unmodified verl 0.9.1 (and its vLLM-CPU rollout), for mart's ``verl_cpu`` tests.

verl imports this module in every one of its processes when ``VERL_USE_EXTERNAL_MODULES=mart_verl_cpu`` (the hook
in ``verl/__init__.py``), and ``VERL_PLATFORM=cpu`` selects the platform registered here with verl's
``PlatformRegistry`` (``verl/plugin/platform``). Nothing installed is edited: besides the platform, two runtime
patches, each applied only when the patched module is (or gets) imported:

1. verl's process-group set-up builds ``"cpu:gloo,<device>:<backend>"``, i.e. ``"cpu:gloo,cpu:gloo"`` here, which
   torch refuses (duplicate device type); on the CPU plain ``"gloo"`` is the same thing.
2. vLLM-CPU repacks each linear weight for oneDNN after loading and leaves an empty Parameter without a
   ``weight_loader``, so verl's weight sync into vLLM after each step fails; the layers keep their weights and run
   plain ``F.linear`` instead (slower GEMMs, irrelevant for a tiny model).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import resource
import sys
import types

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

_GB = 1 << 30


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux: the process's peak resident memory stands in for the device's peak allocation
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()


def _mem_get_info(device=None) -> tuple[int, int]:
    pages, avail = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
    size = os.sysconf("SC_PAGE_SIZE")
    return avail * size, pages * size


def _device_module() -> types.ModuleType:
    """What verl calls on ``get_torch_device()``: torch.cpu's functions, plus the CUDA-only ones as CPU stand-ins."""
    m = types.ModuleType("mart_verl_cpu.device")
    cpu = torch.cpu
    for name in ("current_stream", "stream", "Stream", "Event", "synchronize", "device_count", "is_available"):
        if hasattr(cpu, name):
            setattr(m, name, getattr(cpu, name))
    m.is_available = lambda: True
    m.device_count = lambda: 1
    m.current_device = lambda: "cpu"
    m.set_device = lambda device=None: None
    m.empty_cache = lambda: None
    m.ipc_collect = lambda: None
    m.synchronize = lambda device=None: None
    m.set_per_process_memory_fraction = lambda fraction, device=None: None
    m.get_device_name = lambda device=None: "cpu"
    m.mem_get_info = _mem_get_info
    m.memory_allocated = lambda device=None: _rss_bytes()
    m.memory_reserved = lambda device=None: _rss_bytes()
    m.max_memory_allocated = lambda device=None: _peak_rss_bytes()
    m.max_memory_reserved = lambda device=None: _peak_rss_bytes()
    m.reset_peak_memory_stats = lambda device=None: None
    m.get_rng_state = lambda device=None: torch.get_rng_state()
    m.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    m.manual_seed = torch.manual_seed
    m.manual_seed_all = torch.manual_seed
    return m


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl on the CPU: gloo, one fake Ray GPU per worker, shared memory instead of CUDA IPC."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def current_device(self):
        # "cpu", not 0: verl calls tensor.to(get_device_id()) and to_empty(device=...), and 0 means cuda:0
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's resource pools ask Ray for GPUs; the run's ray.init declares one fake GPU (num_gpus=1)
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False  # the weight sync falls back to shared memory

    def cudart(self):
        return None


# ------------------------------------------------------------------------------------------------ patch 1


def _patch_process_group(dist_mod) -> None:
    original = dist_mod.initialize_global_process_group_ray
    if hasattr(original, "__wrapped__"):
        return

    def gloo(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend="gloo")

    gloo.__wrapped__ = original
    dist_mod.initialize_global_process_group_ray = gloo


# ------------------------------------------------------------------------------------------------ patch 2


def _patch_vllm_cpu_gemm(utils_mod) -> None:
    original = getattr(utils_mod, "dispatch_cpu_unquantized_gemm", None)
    if original is None or hasattr(original, "__wrapped__"):
        return

    def keep_weights(layer, remove_weight: bool = False):
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return original(layer, remove_weight)  # not a plain linear layer: vLLM's own handling
        # plain F.linear over the layer's own weight, which stays in place (and current) for verl's weight sync
        layer.cpu_linear = lambda x, weight, bias=None: torch.nn.functional.linear(x, weight, bias)

    keep_weights.__wrapped__ = original
    utils_mod.dispatch_cpu_unquantized_gemm = keep_weights  # vLLM imports it by name at each call


_PATCHES = {
    "verl.utils.distributed": _patch_process_group,
    "vllm.model_executor.layers.utils": _patch_vllm_cpu_gemm,
}


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs a patch right after its module is executed (the module's own loader does the loading)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return None
        inner = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return inner.create_module(s)

            def exec_module(self, module):
                inner.exec_module(module)
                _PATCHES[name](module)

        spec.loader = _Loader()
        return spec


def install() -> None:
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


install()
