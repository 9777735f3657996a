"""Real candidates composed through verl's Hydra config and checked by verl's ``validate_config`` (CPU).

Needs the verl extra (``pip install torch==2.13.0`` then ``pip install '.[verl]'``); skipped otherwise.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl extra not installed: pip install .[verl]")

from mart.trial_runner.verl import VerlBackend
from mart.trial_runner.verl._yaml_keys import YAML_KEYS
from mart.trial_runner.verl.overrides import yaml_keys

pytestmark = [pytest.mark.verl, pytest.mark.timeout(300)]

A = "actor_rollout_ref"
BASE = {
    "data.train_files": "/data/gsm8k/train.parquet",
    "data.val_files": "/data/gsm8k/test.parquet",
    "actor_rollout_ref.model.path": "Qwen/Qwen3-0.6B",
    "trainer.n_gpus_per_node": 8,
    "data.train_batch_size": 256,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 128,
}


def test_installed_yaml_agrees_with_the_shipped_key_list():
    keys, _ = yaml_keys()
    ours = {p for p in YAML_KEYS}
    assert keys is not YAML_KEYS  # read from the installed package
    missing = ours - keys
    assert len(missing) < 0.02 * len(ours), sorted(missing)[:20]
    from importlib import metadata

    from mart.trial_runner.verl._yaml_keys import VERL_VERSION

    if metadata.version("verl") == VERL_VERSION:  # the bundled list is that release's, key for key
        assert keys == YAML_KEYS, (sorted(keys - YAML_KEYS)[:10], sorted(YAML_KEYS - keys)[:10])


def test_good_candidate_passes_and_bad_batch_arithmetic_is_rejected_with_verls_message():
    backend = VerlBackend(base_config=BASE, prevalidate=True)
    good = backend.base_config() | {f"{A}.rollout.gpu_memory_utilization": 0.7, f"{A}.actor.use_kl_loss": True}
    # 250 prompts x n=5 = 1250 is not divisible by 8 GPUs; mart's own constraint and verl both catch it
    bad = backend.base_config() | {"data.train_batch_size": 250}
    runner = backend.make_runner()
    results = backend.verl_validate([runner.config_overrides(good), runner.config_overrides(bad)])
    assert results[0] == [], results[0]
    assert any("real_train_batch_size (1250) must be divisible by minimal possible batch size (8)" in m
               for m in results[1]), results[1]
    # through the backend's validate_config (what the critic calls)
    assert backend.validate_config(good) == []
    errors = backend.validate_config(bad)
    assert any("batch_divisible_by_gpus" in e for e in errors)


def test_runtime_rule_verl_only_finds_after_launch_is_caught_by_the_catalogue():
    # mini 64 x n 5 / 8 GPUs = 40 sequences per GPU: not a multiple of the micro batch 16. verl's
    # validate_config accepts it; its engine asserts at the first update. The catalogue rejects it.
    backend = VerlBackend(base_config=BASE, prevalidate=True)
    cfg = backend.base_config() | {f"{A}.actor.ppo_mini_batch_size": 64}
    assert backend.verl_validate([backend.make_runner().config_overrides(cfg)]) == [[]]
    assert any(e.startswith("micro_divides_mini") for e in backend.validate_config(cfg))


def test_verl_catches_what_the_catalogue_does_not_check():
    # PPO with a critic (gae) but no critic micro batch size: only verl's own checks know the critic
    backend = VerlBackend(base_config=BASE | {"algorithm.adv_estimator": "gae"}, prevalidate=True)
    errors = backend.validate_config(backend.base_config())
    assert any(e.startswith("verl validate_config") and "critic" in e for e in errors), errors
