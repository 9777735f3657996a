"""Typed, whitelisted flat configs -> MARTI's argv list and environment (never a shell string).

Every flag is checked against MARTI's own flag table (``_flags.FLAGS``, read from its argparse calls): its value
type, ``nargs`` and ``choices``. Single values are written ``--flag=value``, so a value that starts with ``-``
can never be read as another flag; ``store_true`` flags appear only when true; ``None`` leaves a flag out
(MARTI's default holds). JSON flags (``--agents``, ``--default_agent``, ``--workflow_args``, ``--reward_alloc``,
``--tools_config``) are built from their ``<flag>.<key>`` entries with ``json.dumps`` (one argv element each).

Secrets never reach the command line or a stored config: ``use_wandb`` is refused (MARTI hands its value to
``wandb.login`` as the API key), and so is any JSON entry whose name says key/token/secret/password.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from mart.state.config_values import check_key
from mart.state.search_space import ConfigError
from mart.trial_runner.marti._flags import FLAGS
from mart.trial_runner.marti.space import AGENT_KEYS, ASYNC_ENV, ASYNC_KEY, JSON_FLAGS

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_RE = re.compile(r"(api_?key|token|secret|password|passwd)", re.IGNORECASE)
#: flags mart never passes: their value is a secret (wandb API key) on the command line.
SECRET_FLAGS = {"use_wandb": "MARTI passes --use_wandb's value to wandb.login as the API key, so it would be on the "
                             "command line and in mart's stored config; log to TensorBoard instead "
                             "(use_tensorboard=PATH)"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _scalar(name: str, spec: dict, value: Any) -> str:
    """One value of flag ``name`` as MARTI's parser would read it back (type and choices checked)."""
    kind = spec.get("type", "str")
    if kind == "int":
        if not _is_int(value):
            raise ConfigError(f"`{name}` must be an integer, but got {value!r}.")
        text = str(value)
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise ConfigError(f"`{name}` must be a finite number, but got {value!r}.")
        text = repr(float(value))
    elif kind == "str":
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"`{name}` must be a string, but got {value!r}.")
        text = str(value)
        if "\n" in text or "\x00" in text:
            raise ConfigError(f"`{name}` may not contain newlines or NUL bytes.")
    else:  # json flags are built elsewhere
        raise ConfigError(f"`{name}` is a JSON flag: give its entries as {name}.<key>.")
    choices = spec.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"`{name}` must be one of {list(choices)}, but got {value!r}.")
    return text


def flag_args(name: str, value: Any) -> list[str]:
    """argv elements of one global flag (empty when the flag is off or None)."""
    spec = FLAGS.get(name)
    if spec is None:
        raise ConfigError(f"`{name}` is not a flag of MARTI's multi_agent_train_ppo_ray (commit-pinned list).")
    if name in SECRET_FLAGS:
        raise ConfigError(f"`{name}` is refused: {SECRET_FLAGS[name]}.")
    if value is None:
        return []
    if spec.get("action") == "store_true":
        if not isinstance(value, bool):
            raise ConfigError(f"`{name}` is a switch: true or false, but got {value!r}.")
        return [f"--{name}"] if value else []
    nargs = spec.get("nargs")
    if nargs is None:
        return [f"--{name}={_scalar(name, spec, value)}"]
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if _is_int(nargs) and len(items) != nargs:
        raise ConfigError(f"`{name}` takes {nargs} values, but got {items!r}.")
    if nargs == "+" and not items:
        raise ConfigError(f"`{name}` takes at least one value.")
    texts = [_positional(_scalar(name, spec, v)) if spec.get("type") in ("int", "float") else _scalar(name, spec, v)
             for v in items]
    if any(t.startswith("-") and not _ARGPARSE_NEGATIVE.match(t) for t in texts):
        raise ConfigError(f"`{name}`: a value may not start with '-' (it would read as a flag): {texts!r}.")
    return [f"--{name}", *texts]


#: what argparse takes for a negative number rather than an option (``ArgumentParser._negative_number_matcher``
#: up to Python 3.12: https://github.com/python/cpython/blob/3.12/Lib/argparse.py); ``-1e-05`` is not one
_ARGPARSE_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _positional(text: str) -> str:
    """A number in plain positional notation (``-1e-05`` -> ``-0.00001``): a value of a multi-value flag is a
    separate argv element, and argparse reads ``-1e-05`` there as an unknown option ("expected 2 arguments")."""
    return format(Decimal(text), "f") if "e" in text.lower() else text


def _json_value(where: str, value: Any) -> Any:
    """A JSON-safe copy of ``value`` (finite numbers, str keys), or ConfigError naming ``where``."""
    if value is None or isinstance(value, (bool, str)) or _is_int(value):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"`{where}` must be finite, but got {value!r}.")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(where, v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(f"{where}.{k}", v) for k, v in value.items()}
    raise ConfigError(f"`{where}` must be JSON data, but got {type(value).__name__}.")


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict], dict[int, dict], dict[str, str]]:
    """(global flags, JSON flag objects, agents by index, environment) of a flat config; every key checked."""
    flags: dict[str, Any] = {}
    objects: dict[str, dict] = {}
    agents: dict[int, dict] = {}
    env: dict[str, str] = {}
    for key, value in config.items():
        check_key(key)
        head, _, rest = key.partition(".")
        if key == ASYNC_KEY:
            if value is not None:
                if not _is_int(value) or value < 1:
                    raise ConfigError(f"`{ASYNC_KEY}` must be a positive integer, but got {value!r}.")
                env[ASYNC_ENV] = str(value)
            continue
        if head in JSON_FLAGS and rest:
            if head == "agents":
                idx, _, name = rest.partition(".")
                if not idx.isdigit() or not _NAME_RE.match(name or ""):
                    raise ConfigError(f"`{key}`: agent keys are agents.<index>.<name>.")
                if name not in AGENT_KEYS:
                    raise ConfigError(f"`{key}`: MARTI (at the pinned commit) does not read `{name}` from an agent's "
                                      f"config; set the global flag `{name}` instead (it applies to every agent).")
                target, name_ = agents.setdefault(int(idx), {}), name
            elif head == "default_agent":
                if rest not in AGENT_KEYS:
                    raise ConfigError(f"`{key}`: MARTI (at the pinned commit) does not read `{rest}` from an agent's "
                                      f"config; set the global flag `{rest}` instead (it applies to every agent).")
                target, name_ = objects.setdefault(head, {}), rest
            else:
                if not _NAME_RE.match(rest):
                    raise ConfigError(f"`{key}`: {head} entries are {head}.<name> (one level).")
                target, name_ = objects.setdefault(head, {}), rest
            if _SECRET_RE.search(name_):
                raise ConfigError(f"`{key}` looks like a secret; mart never puts secrets on a command line or in a "
                                  "stored config (give it to the job through its environment).")
            if value is not None:  # None: leave it out (the agent inherits the shared value)
                target[name_] = _json_value(key, value)
            continue
        if head in JSON_FLAGS:
            raise ConfigError(f"`{key}` is a JSON flag: give its entries as {key}.<key>.")
        if key not in FLAGS:
            raise ConfigError(f"`{key}` is not a flag of MARTI's multi_agent_train_ppo_ray (commit-pinned list).")
        flag_args(key, value)  # type, choices, nargs and the secret rule, here already
        flags[key] = value
    return flags, objects, agents, env


def build_argv(config: Mapping[str, Any], *, allowed: Iterable[str] | None = None) -> list[str]:
    """MARTI's arguments for a flat config: ``--agents`` (one JSON per agent), the other JSON flags, then the
    global flags in MARTI's own order. Keys outside ``allowed`` (when given) are refused.

    Raises:
        ConfigError: a key not whitelisted, unknown to MARTI, a secret, or a value of the wrong type.
    """
    if allowed is not None:
        allowed = set(allowed)
        bad = sorted(k for k in config if k not in allowed)
        if bad:
            raise ConfigError(f"keys {bad} are neither MARTI search-space knobs, keys of the base config, nor keys mart "
                              "sets; refusing to pass them to MARTI.")
    flags, objects, agents, _ = split_config(config)
    argv: list[str] = []
    if agents:
        argv.append("--agents")
        argv += [json.dumps({str(i): agents[i]}, allow_nan=False) for i in sorted(agents)]
    for name in JSON_FLAGS[1:]:
        if name in objects:
            argv.append(f"--{name}={json.dumps(objects[name], allow_nan=False)}")
    for name in FLAGS:  # MARTI's order: a stable command line
        if name in flags:
            argv += flag_args(name, flags[name])
    return argv


def build_env(config: Mapping[str, Any]) -> dict[str, str]:
    """Environment additions a config asks for (``OPENRLHF_ASYNC_NUM_TASKS``)."""
    return split_config(config)[3]


__all__ = ["SECRET_FLAGS", "build_argv", "build_env", "flag_args", "split_config"]
