"""The local workload's config: defaults, validation messages, search space, documentation."""

from __future__ import annotations

import pytest

from mart.state.search_space import ConfigError
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.config import DEFAULTS, FIELDS, LocalConfig, load_config
from mart.trial_runner.local.space import SEARCH_SPACE
from tests.support.paths import REPO as REPO_ROOT

DOCS = REPO_ROOT / "docs" / "backends.md"
MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def test_defaults_are_valid_and_round_trip():
    cfg = load_config({})
    assert cfg == LocalConfig()
    assert LocalBackend().validate_config(LocalBackend().base_config()) == []
    assert load_config(DEFAULTS) == cfg


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError) as e:
        load_config({"actor_rollout_ref.actor.optim.lrr": 1e-4})
    msg = str(e.value)
    assert "unknown key `actor_rollout_ref.actor.optim.lrr`" in msg
    assert "did you mean `actor_rollout_ref.actor.optim.lr`" in msg


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("data.train_batch_size", "sixteen", "must be an integer"),
        ("data.train_batch_size", 2.5, "must be an integer"),
        ("data.train_batch_size", True, "must be an integer"),
        ("actor_rollout_ref.actor.optim.lr", "fast", "must be a number"),
        ("actor_rollout_ref.actor.optim.lr", float("nan"), "must be finite"),
        ("actor_rollout_ref.actor.use_kl_loss", 3, "must be a bool"),
        ("actor_rollout_ref.actor.kl_loss_type", "k9", "must be one of"),
        ("actor_rollout_ref.rollout.n", 1, "must lie in [2, 64]"),
        ("trainer.nnodes", 2, "must be one of [1]"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(key, value, words):
    with pytest.raises(ConfigError) as e:
        load_config({key: value})
    assert f"`{key}`" in str(e.value) and words in str(e.value)


def test_numeric_coercions_that_are_safe():
    cfg = load_config({"data.train_batch_size": 32.0, "actor_rollout_ref.actor.optim.lr": 1,
                       "actor_rollout_ref.actor.use_kl_loss": "false"})
    assert cfg.train_batch_size == 32 and isinstance(cfg.train_batch_size, int)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.use_kl_loss is False


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({MICRO: 48}, "must be divisible by `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` (48)"),
        ({"data.train_batch_size": 4}, "`data.train_batch_size` (4) must be >= `actor_rollout_ref.actor.ppo_mini_batch_size` (8)"),
        ({"data.train_batch_size": 12}, "must be divisible by `actor_rollout_ref.actor.ppo_mini_batch_size`"),
        ({MICRO: None}, "must be set when `actor_rollout_ref.actor.use_dynamic_bsz` is False"),
        ({"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": None}, "must be set when"),
        ({"actor_rollout_ref.actor.use_dynamic_bsz": True, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 20},
         "one longest sequence must fit"),
        ({"data.max_response_length": 60}, "must be <= `local.model.block_size` (64)"),
        ({"data.max_prompt_length": 8}, "the task's longest prompt would be cut"),
        ({"local.model.n_head": 3}, "must be divisible by `local.model.n_head`"),
        ({"actor_rollout_ref.rollout.val_kwargs.do_sample": True}, "must be > 0"),
        ({"trainer.test_freq": 0}, "`trainer.test_freq` must be -1"),
    ],
)
def test_inconsistent_batch_arithmetic_is_rejected_with_the_rule(overrides, words):
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    assert words in str(e.value)
    assert "[rule " in str(e.value)


def test_dynamic_bsz_lifts_the_micro_batch_rules():
    cfg = load_config({"actor_rollout_ref.actor.use_dynamic_bsz": True, MICRO: None,
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": None,
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None})
    assert cfg.use_dynamic_bsz and cfg.ppo_micro_batch_size_per_gpu is None


def test_all_errors_are_reported_at_once():
    errors = LocalBackend().validate_config({**DEFAULTS, "bogus.key": 1, "data.train_batch_size": "x"})
    assert len(errors) == 2


def test_search_space_defaults_equal_backend_defaults_and_are_in_range():
    assert SEARCH_SPACE.backend == "local"
    for p in SEARCH_SPACE.params:
        assert p.default == DEFAULTS[p.key], p.key
        assert p.validate(p.default) == p.default
        assert p.description
    assert {p.stage for p in SEARCH_SPACE.params} == {"system", "learning"}
    assert SEARCH_SPACE.check_constraints(DEFAULTS) == []


def test_search_space_constraints_catch_cross_knob_breaks():
    bad = {**DEFAULTS, MICRO: 48}
    msgs = SEARCH_SPACE.check_constraints(bad)
    assert len(msgs) == 1 and msgs[0].startswith("mini_batch_divisible_by_micro:")
    # changing the group size changes the mini-batch in sequences: 8 x 6 = 48 is not divisible by 32
    msgs = SEARCH_SPACE.check_constraints({**DEFAULTS, MICRO: 32, "actor_rollout_ref.rollout.n": 6})
    assert msgs and "(48)" in msgs[0]


def test_defaults_are_not_already_the_fastest():
    """The stage-1 tuner needs room: conservative micro-batches and checkpointing on, as verl."""
    micro = SEARCH_SPACE[MICRO]
    assert micro.default < 16 <= micro.high
    assert SEARCH_SPACE["actor_rollout_ref.model.enable_gradient_checkpointing"].default is True
    assert SEARCH_SPACE["actor_rollout_ref.rollout.max_num_seqs"].default < 128


def test_every_key_is_documented_with_its_default():
    text = DOCS.read_text()
    section = text[text.index("## local (the embedded default)"):]
    section = section[: section.find("\n## ", 5)] if "\n## " in section[5:] else section
    for key in FIELDS:
        assert f"`{key}`" in section, f"{key} is not documented"
    assert "| `actor_rollout_ref.actor.optim.lr` | `0.0001` |" in section
