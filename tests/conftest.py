"""Shared test fixtures. Keep it small: each fixture here is used by several test modules."""

from __future__ import annotations

import pytest

# A local-workload config small enough for tests (a 2-layer, 64-wide model sorting 3-6 digits):
# its base model trains in a few seconds, a step takes ~0.1 s, and GRPO still visibly learns.
LOCAL_TINY_CONFIG = {
    "local.model.n_layer": 2,
    "local.model.n_embd": 64,
    "local.model.n_head": 4,
    "local.model.block_size": 24,
    "local.task.min_digits": 3,
    "local.task.max_digits": 6,
    "local.task.val_size": 64,
    "local.base_model.warmup_steps": 100,
    "local.base_model.lr": 3e-3,
    "data.max_prompt_length": 8,
    "data.max_response_length": 12,
    "data.train_batch_size": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 32,
    "actor_rollout_ref.actor.optim.lr": 3e-4,
    "actor_rollout_ref.rollout.max_num_seqs": 64,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 64,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64,
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "trainer.test_freq": 5,
}


TOY_BACKEND = "tests.support.toy_backend:make_backend"


@pytest.fixture(autouse=True)
def _allow_toy_backend(monkeypatch):
    """Runs on the toy plugin backend resume without `--backend` again: the test's user allows it (a run
    folder's plugin spec is otherwise refused, see ``mart.trial_runner.registry.untrusted_parts``)."""
    monkeypatch.setenv("MART_ALLOWED_BACKENDS", TOY_BACKEND)


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
