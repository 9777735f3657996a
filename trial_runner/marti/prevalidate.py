"""Pre-validation of a MARTI command line with an argparse parser built from MARTI's own flag table.

MARTI cannot be installed here (it is not on PyPI, and a git install needs the network), so its CLI is not run.
Instead ``_flags.FLAGS`` - every ``add_argument`` call of ``marti/cli/multi_agent_train_ppo_ray.py`` at
``_flags.MARTI_COMMIT``, extracted from the source by ``gen_flags`` - rebuilds the same parser (types,
``nargs``, ``choices``, ``store_true``, ``json.loads`` for the JSON flags), and a candidate's argv must parse
with it. What MARTI checks after parsing (its asserts on layouts and batches) is in the catalogue's
constraints (``space.CONSTRAINTS``). docs/backends.md says what only a real MARTI run can check.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from mart.trial_runner.marti._flags import FLAGS

_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str, "json": json.loads}


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits by default; here a refusal is a value
        raise _Refused(message)


def marti_parser() -> argparse.ArgumentParser:
    """An argparse parser with MARTI's flags (``multi_agent_train_ppo_ray``, commit-pinned)."""
    parser = _Parser(prog="marti.cli.multi_agent_train_ppo_ray", add_help=False, allow_abbrev=True)
    for name, spec in FLAGS.items():
        kw: dict[str, Any] = {}
        if spec.get("action") == "store_true":
            kw["action"] = "store_true"
        else:
            kw["type"] = _TYPES[spec.get("type", "str")]
            for key in ("nargs", "choices", "required"):
                if key in spec:
                    kw[key] = spec[key]
        kw["default"] = spec.get("default")
        parser.add_argument(f"--{name}", **kw)
    return parser


def parse_argv(argv: Sequence[str]) -> argparse.Namespace:
    """MARTI's reading of ``argv`` (flags only, no entrypoint). Raises ValueError with argparse's message."""
    try:
        return marti_parser().parse_args(list(argv))
    except _Refused as e:
        raise ValueError(str(e)) from None
    except json.JSONDecodeError as e:  # pragma: no cover - argparse reports type errors itself
        raise ValueError(f"invalid JSON: {e}") from None


def check_argv(argv: Sequence[str]) -> list[str]:
    """Errors of a candidate's flags (empty = MARTI's parser takes them, and the JSON objects have its shape).

    ``--agents`` is required by MARTI; a candidate's own flags may lack it, so it is checked only when present.
    """
    argv = list(argv)
    probe = argv if "--agents" in argv else ["--agents", "{}", *argv]
    try:
        ns = parse_argv(probe)
    except ValueError as e:
        return [str(e)]
    errors = []
    for obj in ns.agents:
        if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
            errors.append(f"--agents takes JSON objects {{id: {{config}}}}, got {obj!r}")
    for name in ("default_agent", "workflow_args", "reward_alloc", "tools_config"):
        if not isinstance(getattr(ns, name), dict):
            errors.append(f"--{name} takes a JSON object")
    return errors


__all__ = ["check_argv", "marti_parser", "parse_argv"]
