"""Backend lookup by name, or ``package.module:factory`` for a user's plugin."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from mart.trial_runner.base import Backend

# name -> "module:factory"; imported lazily so optional extras are only needed when used.
BUILTIN_BACKENDS: dict[str, str] = {
    "local": "mart.trial_runner.local.backend:LocalBackend",
    "verl": "mart.trial_runner.verl.backend:VerlBackend",
    "sim": "mart.trial_runner.sim.backend:SimBackend",
}


def load_backend(spec: str, **options: Any) -> Backend:
    """Build a backend from a builtin name or ``package.module:factory``.

    Raises:
        ValueError: unknown name, or a plugin that cannot be imported or returns no ``Backend``.
    """
    target = BUILTIN_BACKENDS.get(spec, spec)
    if ":" not in target:
        raise ValueError(
            f"unknown backend {spec!r}: use one of {sorted(BUILTIN_BACKENDS)} or 'package.module:factory'"
        )
    module_name, _, attr = target.partition(":")
    if os.getcwd() not in sys.path:  # plugins in the user's project import like `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"backend {spec!r}: cannot import {module_name!r} ({e})") from e
    factory: Callable[..., Any] | None = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"backend {spec!r}: {module_name!r} has no attribute {attr!r}")
    backend = factory(**options)
    if not isinstance(backend, Backend):
        raise ValueError(f"backend {spec!r}: {target} returned {type(backend).__name__}, not a trial_runner.base.Backend")
    return backend
