"""Backend lookup by name, or ``package.module:factory`` for a user's plugin."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any, Callable

from mart.trial_runner.base import Backend

# name -> "module:factory"; imported lazily so optional extras are only needed when used.
BUILTIN_BACKENDS: dict[str, str] = {
    "local": "mart.trial_runner.local.backend:LocalBackend",
    "verl": "mart.trial_runner.verl.backend:VerlBackend",
    "sim": "mart.trial_runner.sim.backend:SimBackend",
}


def backend_factory(spec: str) -> Callable[..., Any]:
    """The factory a builtin name or ``package.module:factory`` names (imported, not called).

    Raises:
        ValueError: unknown name, or a plugin module or attribute that cannot be imported.
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
    return factory


def factory_options(factory: Callable[..., Any]) -> tuple[list[str], bool]:
    """(the keyword options ``factory`` declares, whether it also takes any other via ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: cannot check
        return [], True
    names = [p.name for p in params
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def check_backend_options(spec: str, options: Mapping[str, Any],
                          factory: Callable[..., Any] | None = None) -> None:
    """Refuse options the backend's factory does not declare, naming the valid ones.

    The accepted options are the factory's keyword parameters (a class: its ``__init__``'s); a plugin
    factory that takes ``**kwargs`` accepts any and is responsible for its own checks.

    Raises:
        ValueError: unknown options (with the valid list), or the backend cannot be found.
    """
    names, takes_any = factory_options(factory or backend_factory(spec))
    unknown = sorted(k for k in options if k not in names)
    if unknown and not takes_any:
        raise ValueError(f"backend {spec!r} takes no option {', '.join(map(repr, unknown))}; "
                         f"valid options: {', '.join(names) or '(none)'}")


def load_backend(spec: str, **options: Any) -> Backend:
    """Build a backend from a builtin name or ``package.module:factory``.

    Raises:
        ValueError: unknown name, an option the factory does not take, or a plugin that cannot be
            imported or returns no ``Backend``.
    """
    factory = backend_factory(spec)
    check_backend_options(spec, options, factory)
    backend = factory(**options)
    if not isinstance(backend, Backend):
        target = BUILTIN_BACKENDS.get(spec, spec)
        raise ValueError(f"backend {spec!r}: {target} returned {type(backend).__name__}, not a trial_runner.base.Backend")
    return backend
