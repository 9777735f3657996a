"""Shared test fixtures. Keep it small: each fixture here is used by several test modules."""

from __future__ import annotations

import sys

import pytest

# Where the environment sets PYTHONDONTWRITEBYTECODE, pytest re-rewrote the asserts of every test module in every
# worker on every run (~5 s of CPU per worker: a sixth of collection); the checkout's bytecode goes to its
# git-ignored __pycache__ folders instead. Set before mart is imported, so its modules are cached too.
sys.dont_write_bytecode = False

from mart.trial_runner.local.config import TINY_CONFIG  # noqa: E402

# the local workload's tiny config (a step takes ~0.1 s); one source with scripts/soak_kill.py and the bench
LOCAL_TINY_CONFIG = TINY_CONFIG


TOY_BACKEND = "tests.support.toy_backend:make_backend"


def pytest_collection_modifyitems(config, items) -> None:
    """Test files with end-to-end sessions (``slow``) first, each file's tests kept together and in order: with
    ``--dist loadfile`` a worker takes the next file as it frees, and a long file started last leaves the other
    workers idle at the end (with 3 workers the suite's time did not move measurably either way: 600 and 607 s)."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items[:] = sorted(items, key=lambda item: item.nodeid.split("::")[0] not in slow)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a venv without xdist (the verl one) runs without it
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: two workers per core. A session test waits on its trial processes (each a fresh Python
    importing torch) and its tuner's polls: it keeps about two thirds of a core busy (``time`` of a 4-trial local
    session: 34 s of CPU in 52 s), so one worker per core left a third of the cores idle (the suite on 2 idle
    cores: 668 s with 2 workers, 587-607 s with 3, 580-622 s with 4). ``MART_TEST_WORKERS`` sets the number."""
    import os

    if os.environ.get("MART_TEST_WORKERS"):
        return max(1, int(os.environ["MART_TEST_WORKERS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, 2 * cores)


@pytest.fixture(autouse=True)
def _allow_toy_backend(monkeypatch):
    """Runs on the toy plugin backend resume without `--backend` again: the test's user allows it (a run
    folder's plugin spec is otherwise refused, see ``mart.trial_runner.registry.untrusted_parts``)."""
    monkeypatch.setenv("MART_ALLOWED_BACKENDS", TOY_BACKEND)
    # the job model's memory probe answers from its shipped measurements only: no test pays for a measurement
    # it did not ask for (tests/graph/test_memory_cmd.py measures on purpose)
    monkeypatch.setenv("MART_MEMORY_PROBE", "cached")


@pytest.fixture(autouse=True)
def _nothing_left_behind(request):
    """A test that fails (or forgets) leaves no process running: what it started in its ``tmp_path`` (the trials
    its runs recorded, the tuners and trials naming the folder) is ended after it (``tests/support/cleanup.py``)."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    import time

    import psutil

    root = request.getfixturevalue("tmp_path")
    since, before = time.time() - 2.0, set(psutil.pids())  # 2 s: the clock of /proc's start times is coarser
    yield
    from tests.support.cleanup import reap

    reap(root, since, before)


@pytest.fixture(scope="session")
def _local_cache_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("mart-cache"))


@pytest.fixture
def local_cache(_local_cache_root, monkeypatch) -> str:
    """A per-session ``$MART_CACHE_DIR`` (base models are built once per test session, not in ~/.cache)."""
    monkeypatch.setenv("MART_CACHE_DIR", _local_cache_root)
    return _local_cache_root


@pytest.fixture
def local_tiny_config(local_cache) -> dict:
    """Overrides (flat verl keys) of a tiny local workload; uses the session's base-model cache."""
    return dict(LOCAL_TINY_CONFIG)


#: environment variables the LLM agents read: a developer's own settings must not reach the tests
LLM_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "MART_LLM_MODEL", "MART_LLM_STRUCTURED",
           "MART_LLM_MAX_RETRIES", "MART_LLM_REPAIR_ROUNDS", "MART_LLM_STREAM", "MART_LLM_MAX_TOKENS")


@pytest.fixture
def clean_llm_env(monkeypatch):
    """No LLM setting from the environment (use: ``pytestmark = [pytest.mark.usefixtures("clean_llm_env")]``)."""
    for name in LLM_ENV:
        monkeypatch.delenv(name, raising=False)
