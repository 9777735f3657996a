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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# the one reader/writer of config values (docs/configs.md); re-exported here for the verl runner
from mart.state.config_values import (
    check_key,
    flatten,
    format_value,
    load_config_file,
    parse_assignments,
)
from mart.state.search_space import ConfigError

__all__ = ["build_overrides", "check_key", "format_value", "load_base_config", "needs_plus", "override",
           "yaml_keys"]


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


def load_base_config(source: str | Path | Mapping[str, Any] | list[str] | None) -> dict[str, Any]:
    """The user's base verl config as a flat dict (see the module docstring for the accepted forms).

    Raises:
        ConfigError: unreadable file, wrong shape, or an invalid key.
    """
    if source is None:
        return {}
    if isinstance(source, Mapping):
        flat = flatten(source)
    elif isinstance(source, list):
        flat = parse_assignments(str(item) for item in source)
    else:
        flat = load_config_file(source)
    for key in flat:
        check_key(key)
    return flat
