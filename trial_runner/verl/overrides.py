"""Flat mart configs <-> verl's Hydra command-line overrides.

A config is a flat mapping of verl keys (``actor_rollout_ref.rollout.n``) to typed values; it reaches a
command line only as a typed argv list of ``key=value`` strings (never through a shell). A key absent
from verl's yaml gets Hydra's ``+`` prefix (Hydra refuses it otherwise).

The user's base config (``--base-config FILE``) is YAML or JSON, either

* a mapping of flat (``data.train_files: ...``) or nested keys to values, or
* a list of Hydra override strings (``- data.train_files=/data/gsm8k/train.parquet``, ``+`` allowed),

and is merged under the candidate (the candidate's knobs win).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mart.state.search_space import ConfigError

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_@\-]*(\.[A-Za-z0-9_@\-]+)*$")
_BARE_RE = re.compile(r"^[A-Za-z0-9_./@\-][A-Za-z0-9_./@+\-]*$")
_NUMBER_RE = re.compile(r"^[+-]?(\d[\d_]*)?(\.\d*)?([eE][+-]?\d+)?$")
_EXP_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")  # YAML 1.1 reads these as strings
_RESERVED = {"true", "false", "null", "none", "nan", "inf", "-inf", "+inf"}


def check_key(key: str) -> str:
    """Return ``key`` if it is a plain dotted verl key, else raise ``ConfigError`` (no injection via keys)."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ConfigError(f"`{key}` is not a valid verl config key (dotted names of letters, digits, _ - @).")
    return key


def format_value(value: Any) -> str:
    """Render a typed value in Hydra's override grammar.

    bool -> ``true``/``false``; None -> ``null``; numbers as Python writes them; lists ``[a,b]``;
    dicts ``{k:v}``; strings bare when safe, else single-quoted with ``\\`` escapes.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{check_key(str(k))}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text and _BARE_RE.match(text) and text.lower() not in _RESERVED and not _NUMBER_RE.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@functools.lru_cache(maxsize=1)
def yaml_keys() -> tuple[frozenset[str], tuple[str, ...]]:
    """(every leaf key of verl's trainer yaml, mappings that are open/empty there).

    Read from the installed verl's ``_generated_ppo_trainer.yaml`` when verl is importable; else the list
    shipped with mart (verl 0.9.0).
    """
    from mart.trial_runner.verl._yaml_keys import OPEN_MAPPINGS, YAML_KEYS

    try:
        import importlib.util

        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.submodule_search_locations:
            return YAML_KEYS, OPEN_MAPPINGS
        path = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config" / "_generated_ppo_trainer.yaml"
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception:
        return YAML_KEYS, OPEN_MAPPINGS
    keys: list[str] = []
    open_maps: list[str] = []
    _walk(data, "", keys, open_maps)
    return frozenset(keys), tuple(open_maps)


def _walk(node: Any, prefix: str, keys: list[str], open_maps: list[str]) -> None:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _walk(v, f"{prefix}.{k}" if prefix else str(k), keys, open_maps)
        return
    keys.append(prefix)
    if isinstance(node, dict):
        open_maps.append(prefix)


def needs_plus(key: str) -> bool:
    """True when Hydra needs ``+key=...`` (the key is not in verl's yaml). ``hydra.*`` keys never do."""
    if key.startswith("hydra."):
        return False
    keys, _ = yaml_keys()
    return key not in keys


def override(key: str, value: Any) -> str:
    """One ``key=value`` (or ``+key=value``) override string."""
    check_key(key)
    return f"{'+' if needs_plus(key) else ''}{key}={format_value(value)}"


def build_overrides(config: Mapping[str, Any], *, allowed: Iterable[str] | None = None) -> list[str]:
    """Overrides for a flat config, in key order; keys outside ``allowed`` are refused.

    Raises:
        ConfigError: a key is not whitelisted or not a plain dotted key.
    """
    if allowed is not None:
        allowed = set(allowed)
        bad = sorted(k for k in config if k not in allowed)
        if bad:
            raise ConfigError(
                f"keys {bad} are neither verl search-space knobs, keys of the base config, nor keys mart sets; "
                "refusing to pass them to verl."
            )
    return [override(k, v) for k, v in config.items()]


def parse_value(text: str) -> Any:
    """Parse a Hydra override value into a typed value (YAML-ish: true, null, 1e-6, [a,b], 'quoted')."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")
    if text.lower() == "null":
        return None
    try:
        import yaml

        value = yaml.safe_load(text)
    except Exception:
        return text
    if isinstance(value, str) and _EXP_RE.match(text):  # YAML 1.1 reads 1e-6 as a string
        return float(text)
    return value


def parse_override(item: str) -> tuple[str, Any]:
    """``[+|++]key=value`` -> (key, typed value). Deletions (``~key``) are refused."""
    item = item.strip()
    if item.startswith("~"):
        raise ConfigError(f"override {item!r}: deletions are not supported in a mart base config.")
    body = item.lstrip("+")
    key, sep, value = body.partition("=")
    if not sep:
        raise ConfigError(f"override {item!r} is not of the form key=value.")
    return check_key(key.strip()), parse_value(value)


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> flat dotted keys (dotted keys at any level are kept as they are)."""
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def load_base_config(source: str | Path | Mapping[str, Any] | list[str] | None) -> dict[str, Any]:
    """The user's base verl config as a flat dict (see the module docstring for the accepted forms).

    Raises:
        ConfigError: unreadable file, wrong shape, or an invalid key.
    """
    if source is None:
        return {}
    if isinstance(source, Mapping):
        data: Any = dict(source)
    elif isinstance(source, list):
        data = source
    else:
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"base config {str(path)!r}: cannot read it ({e}).") from e
        data = _load_text(text, path)
    if isinstance(data, list):
        flat = dict(parse_override(str(item)) for item in data)
    elif isinstance(data, Mapping):
        flat = flatten(data)
    elif data is None:
        flat = {}
    else:
        raise ConfigError("a base config must be a mapping of verl keys to values or a list of overrides.")
    for key in flat:
        check_key(key)
    return flat


def _load_text(text: str, path: Path) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"base config {str(path)!r}: invalid JSON ({e}).") from e
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML comes with ray/langgraph
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"base config {str(path)!r}: install PyYAML to read YAML ({e}).") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"base config {str(path)!r}: invalid YAML ({e}).") from e
    if isinstance(data, Mapping):  # YAML 1.1 reads 1e-6 as a string: fix numbers written that way
        data = _fix_numbers(data)
    return data


def _fix_numbers(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {k: _fix_numbers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_fix_numbers(v) for v in node]
    if isinstance(node, str) and _EXP_RE.match(node):
        return float(node)
    return node
