"""Pre-validation of candidate configs with verl itself, on the CPU, before any launch.

Composes each candidate through verl's Hydra config (``ppo_trainer``) and runs verl's ``validate_config``
(batch arithmetic, micro batch sizes, actor/critic config checks). It runs in a child process so that
whatever verl does (``sys.exit``, asserts, imports that touch CUDA, prints) never reaches the tuner; one
child validates a whole batch of candidates (importing verl takes ~4 s).

    python -m mart.trial_runner.verl.prevalidate --out RESULT.json < CANDIDATES.json

reads a JSON list of override lists and writes a JSON list of error lists (``[]`` = valid).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


def verl_available() -> bool:
    """True when the ``verl`` package can be imported here (the ``verl`` extra is installed)."""
    try:
        return importlib.util.find_spec("verl") is not None
    except (ImportError, ValueError):
        return False


def _config_dir() -> str:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def compose_and_validate(overrides: list[str]) -> list[str]:
    """In-process: compose ``overrides`` with verl's Hydra config and run ``validate_config``.

    Returns verl's messages (empty when the config passes). Never raises and never exits.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [o for o in overrides if not o.lstrip("+").startswith("hydra.")]
    sink = io.StringIO()
    try:
        GlobalHydra.instance().clear()
        with redirect_stdout(sink), redirect_stderr(sink):
            with initialize_config_dir(config_dir=_config_dir(), version_base=None):
                cfg = compose(config_name="ppo_trainer", overrides=overrides)
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils.config import validate_config

            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except SystemExit as e:
        tail = sink.getvalue().strip().splitlines()[-3:]
        return [f"verl exited with code {e.code}: {' | '.join(tail)}".strip()]
    except BaseException as e:  # noqa: BLE001 - verl's asserts, ValueErrors, Hydra's override errors
        msg = str(e).strip() or type(e).__name__
        return [f"{type(e).__name__}: {msg}"]
    finally:
        GlobalHydra.instance().clear()
    return []


def validate_many(override_lists: list[list[str]], timeout_s: float = 300.0) -> list[list[str]]:
    """Validate several candidates in one child process; one error list per candidate.

    Raises:
        RuntimeError: verl is not installed, or the child process failed as a whole.
    """
    if not override_lists:
        return []
    if not verl_available():
        raise RuntimeError("verl is not installed (pip install 'mart[verl]')")
    with tempfile.TemporaryDirectory(prefix="mart-prevalidate-") as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("MART_PREVALIDATE_CUDA", ""),
               "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(
            [sys.executable, "-m", "mart.trial_runner.verl.prevalidate", "--out", str(out)],
            input=json.dumps(override_lists), text=True, capture_output=True, timeout=timeout_s, env=env, cwd=tmp,
            check=False,
        )
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            raise RuntimeError(f"verl pre-validation failed (exit {proc.returncode}): {' | '.join(tail)}") from None
    if len(result) != len(override_lists):
        raise RuntimeError("verl pre-validation returned a wrong number of results")
    return [list(map(str, errs)) for errs in result]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mart.trial_runner.verl.prevalidate")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    override_lists = json.loads(sys.stdin.read() or "[]")
    results = [compose_and_validate([str(o) for o in ovs]) for ovs in override_lists]
    tmp = f"{args.out}.tmp"
    Path(tmp).write_text(json.dumps(results))
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
