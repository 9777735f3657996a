"""Real verl 0.9.1 (and a real ``vllm serve``) on the CPU under mart: the ``verl_cpu`` tests.

They run only when asked for (``-m verl_cpu``) in the venv of ``scripts/verl_cpu_env.sh``: each real run takes
~9 GB and minutes, so the main suite never starts one, even where verl is installed. One tiny job is built per
session and shared; the runs go one at a time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import psutil
import pytest

from tests.support.verl_cpu.procs import marked_processes

MARK = "verl_cpu"


def _missing() -> str | None:
    for mod in ("verl", "vllm", "transfer_queue", "pandas"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed: build the venv with scripts/verl_cpu_env.sh VENV"
    return None


def pytest_collection_modifyitems(config, items):
    asked = MARK in (config.option.markexpr or "")
    missing = _missing()
    for item in items:
        if MARK not in item.keywords:
            continue
        if not asked:
            item.add_marker(pytest.mark.skip(reason=f"real verl runs only with -m {MARK} (minutes, ~9 GB each)"))
        elif missing:
            item.add_marker(pytest.mark.skip(reason=missing))


@pytest.fixture(scope="session")
def tiny_job(tmp_path_factory):
    """The tiny job (built once per session) with its environment set for the whole session."""
    import tempfile

    from tests.support.verl_cpu.job import build

    ray_tmp = Path(tempfile.mkdtemp(prefix="mray-", dir="/tmp"))
    job = build(tmp_path_factory.mktemp("tiny-job"), ray_tmp=ray_tmp)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in job.env().items():
            mp.setenv(k, v)
        mp.delenv("RAY_ADDRESS", raising=False)
        yield job


@pytest.fixture
def runs(tmp_path):
    """A runs folder; whatever trial process is left under it when the test ends is ended (and fails the test)."""
    root = tmp_path / "runs"
    root.mkdir()
    yield root
    left = marked_processes(root)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)
    assert not left, f"trial processes outlived the test: {[p.pid for p in left]}"
