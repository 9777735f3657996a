"""The verl search-space catalogue: keys exist in verl's yaml, defaults are valid, constraints bite."""

from __future__ import annotations

import pytest

from mart.state.search_space import ConfigError
from mart.trial_runner.verl._yaml_keys import YAML_KEYS
from mart.trial_runner.verl.space import SEARCH_SPACE, VERL_DEFAULTS

A = "actor_rollout_ref"


def test_every_knob_is_a_real_verl_key_with_a_valid_default_and_a_description():
    assert SEARCH_SPACE.backend == "verl"
    assert SEARCH_SPACE.stage_params("system") and SEARCH_SPACE.stage_params("learning")
    for p in SEARCH_SPACE.params:
        assert p.key in YAML_KEYS, p.key
        assert p.validate(p.default) == p.default, p.key
        assert len(p.description) > 20, p.key
    for key in VERL_DEFAULTS:
        assert key in YAML_KEYS, key


def test_catalogue_defaults_follow_verl_except_the_null_micro_batches():
    d = SEARCH_SPACE.defaults()
    assert d[f"{A}.rollout.gpu_memory_utilization"] == 0.5
    assert d[f"{A}.rollout.tensor_model_parallel_size"] == 2
    assert d[f"{A}.actor.optim.lr"] == 1e-6
    assert d[f"{A}.actor.ppo_micro_batch_size_per_gpu"] == 16  # verl: null; GRPO examples set one
    assert VERL_DEFAULTS[f"{A}.actor.ppo_micro_batch_size_per_gpu"] is None
    assert SEARCH_SPACE.check_constraints(d) == []


def test_validate_overrides_types_and_ranges():
    ok = SEARCH_SPACE.validate_overrides({f"{A}.rollout.tensor_model_parallel_size": "4",
                                          f"{A}.actor.use_dynamic_bsz": "true"})
    assert ok == {f"{A}.rollout.tensor_model_parallel_size": 4, f"{A}.actor.use_dynamic_bsz": True}
    with pytest.raises(ConfigError, match="one of"):
        SEARCH_SPACE.validate_overrides({f"{A}.rollout.tensor_model_parallel_size": 3})
    with pytest.raises(ConfigError, match="system-stage"):
        SEARCH_SPACE.validate_overrides({f"{A}.rollout.max_num_seqs": 512}, stage="learning")


def _broken(over: dict) -> list[str]:
    cfg = SEARCH_SPACE.defaults()
    cfg.update(over)
    return [m.split(":")[0] for m in SEARCH_SPACE.check_constraints(cfg)]


@pytest.mark.parametrize(
    "over, rule",
    [
        ({"trainer.n_gpus_per_node": 3}, "batch_divisible_by_gpus"),
        ({f"{A}.actor.ppo_micro_batch_size_per_gpu": None}, "micro_batch_sizes_set"),
        ({f"{A}.actor.use_kl_loss": True, f"{A}.ref.log_prob_micro_batch_size_per_gpu": None}, "micro_batch_sizes_set"),
        ({"data.train_batch_size": 128, f"{A}.actor.ppo_mini_batch_size": 256}, "mini_batch_le_train_batch"),
        ({f"{A}.actor.ppo_mini_batch_size": 12}, "mini_batch_divisible_by_dp"),
        ({f"{A}.actor.ppo_micro_batch_size_per_gpu": 24}, "micro_divides_mini"),
        ({"trainer.n_gpus_per_node": 4, f"{A}.rollout.tensor_model_parallel_size": 8}, "rollout_parallel_divides_gpus"),
        ({f"{A}.actor.ulysses_sequence_parallel_size": 2, f"{A}.model.use_remove_padding": False}, "sp_needs_remove_padding"),
        ({f"{A}.rollout.val_kwargs.do_sample": True, f"{A}.rollout.temperature": 0.0}, "val_sampling_temperature"),
        ({f"{A}.actor.use_dynamic_bsz": True, f"{A}.actor.ppo_max_token_len_per_gpu": 1024,
          "data.max_response_length": 4096}, "dynamic_bsz_token_cap"),
        ({f"{A}.rollout.enable_chunked_prefill": False, "data.max_response_length": 16384}, "batched_tokens_without_chunked_prefill"),
        ({"algorithm.adv_estimator": "grpo", f"{A}.rollout.n": 1}, "grpo_group_size"),
        ({"trainer.device": "cpu", f"{A}.actor.use_kl_loss": True}, "reference_model_needs_an_accelerator"),
        ({"trainer.device": "cpu", "algorithm.use_kl_in_reward": True}, "reference_model_needs_an_accelerator"),
    ],
)
def test_each_constraint_rejects_its_case(over, rule):
    assert rule in _broken(over)


def test_dynamic_bsz_lifts_the_micro_batch_rules():
    assert _broken({f"{A}.actor.use_dynamic_bsz": True, f"{A}.actor.ppo_micro_batch_size_per_gpu": None,
                    "trainer.n_gpus_per_node": 3, f"{A}.rollout.tensor_model_parallel_size": 1,
                    f"{A}.actor.ppo_mini_batch_size": 255}) == []


def test_non_numeric_value_is_reported_not_raised():
    assert "batch_divisible_by_gpus" in _broken({f"{A}.rollout.n": "many"})


def test_a_reference_model_is_refused_only_on_a_cpu_device():
    assert "reference_model_needs_an_accelerator" not in _broken({f"{A}.actor.use_kl_loss": True})
    assert "reference_model_needs_an_accelerator" not in _broken({"trainer.device": "cpu"})
