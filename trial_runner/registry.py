"""Backend lookup by name, or ``package.module:factory`` for a user's plugin."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Collection, Mapping
from typing import Any, Callable

from mart.trial_runner.base import Backend

# name -> "module:factory"; imported lazily so optional extras are only needed when used.
BUILTIN_BACKENDS: dict[str, str] = {
    "local": "mart.trial_runner.local.backend:LocalBackend",
    "verl": "mart.trial_runner.verl.backend:VerlBackend",
    "sim": "mart.trial_runner.sim.backend:SimBackend",
    "marti": "mart.trial_runner.marti.backend:MartiBackend",
}


# A run's stored options are untrusted input (anyone who can write the run folder wrote them): every
# value that names code to import or a command to run must be one the user allows again.
ALLOW_ENV = "MART_ALLOWED_BACKENDS"
COMMAND_OPTIONS = ("entrypoint", "verl_python", "runner_options")
#: backend options that name an endpoint mart sends a credential to (the Ray dashboard gets RAY_AUTH_TOKEN),
#: with the environment variable that names the same endpoint in this process
ENDPOINT_OPTIONS = {"ray_address": "RAY_ADDRESS"}


def allowed_from_env(extra: Collection[str] = ()) -> set[str]:
    """The allow-list of ``$MART_ALLOWED_BACKENDS`` (comma-separated specs or entrypoints) plus ``extra``."""
    items = [x.strip() for x in os.environ.get(ALLOW_ENV, "").split(",")]
    return {x for x in [*items, *extra] if x}


def untrusted_parts(spec: str, options: Mapping[str, Any], allowed: Collection[str] = ()) -> list[str]:
    """What in a stored backend spec and its options would run code the user has not allowed.

    A builtin name without command options is always fine; a plugin spec (``module:factory``) must be
    in ``allowed``; so must a launch command (``entrypoint``, ``verl_python``) and an endpoint that would get
    a credential (``ray_address``: in ``allowed`` or ``$RAY_ADDRESS``); ``runner_options`` only with full trust.
    """
    parts = []
    if spec not in BUILTIN_BACKENDS and spec not in allowed:
        parts.append(f"plugin backend {spec!r}")
    for key in ("entrypoint", "verl_python"):  # a command / an interpreter to run
        value = options.get(key)
        if value is not None and str(value) not in allowed:
            parts.append(f"launch command {key}={str(value)!r}")
    if options.get("runner_options") is not None:
        parts.append("runner_options")
    for key, env in ENDPOINT_OPTIONS.items():  # an endpoint: mart would send it the user's credential
        value = options.get(key)
        if value is not None and str(value) not in allowed and str(value) != os.environ.get(env):
            parts.append(f"endpoint {key}={str(value)!r} (given `--{key.replace('_', '-')}` again, it gets your token)")
    return parts


def _import_plugin(module_name: str):
    """Import a plugin module; the current directory is searched only for a module found nowhere else.

    Putting the working directory first on ``sys.path`` would let any ``openai.py`` or ``json.py`` lying
    there shadow installed packages; appending it (and only for this module) cannot.
    """
    top = module_name.split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        cwd = os.getcwd()
        here = os.path.exists(os.path.join(cwd, top + ".py")) or os.path.isdir(os.path.join(cwd, top))
        if here and cwd not in sys.path:
            sys.path.append(cwd)
    return importlib.import_module(module_name)


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
    try:
        module = _import_plugin(module_name)
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
    target = BUILTIN_BACKENDS.get(spec, spec)
    if not callable(factory):
        raise ValueError(f"backend {spec!r}: {target} is not callable (a backend factory returns a Backend)")
    try:
        backend = factory(**options)
    except TypeError as e:  # `os:system` and the like: a callable, but not a factory of keyword options
        if spec in BUILTIN_BACKENDS:
            raise
        raise ValueError(f"backend {spec!r}: {target} cannot be called as a backend factory ({e})") from None
    if not isinstance(backend, Backend):
        raise ValueError(f"backend {spec!r}: {target} returned {type(backend).__name__}, not a trial_runner.base.Backend")
    return backend
