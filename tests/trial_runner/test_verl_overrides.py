"""Typed configs -> Hydra overrides, the ``+`` rule, the key whitelist, and base-config files."""

from __future__ import annotations

import json

import pytest

from mart.state.config_values import parse_assignment, parse_value
from mart.state.search_space import ConfigError
from mart.trial_runner.verl.overrides import (
    build_overrides,
    format_value,
    load_base_config,
    needs_plus,
    override,
)
from mart.trial_runner.verl.runner import split_entrypoint


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"), (False, "false"), (None, "null"), (8, "8"), (1e-6, "1e-06"), (0.5, "0.5"),
        (float("nan"), "nan"), (["console", "file"], "[console,file]"), ([1, 2.5, True], "[1,2.5,true]"),
        ("vllm", "vllm"), ("token-mean", "token-mean"), ("/data/gsm8k/train.parquet", "/data/gsm8k/train.parquet"),
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
        ("a b", "'a b'"), ("x=y", "'x=y'"), ("true", "'true'"), ("123", "'123'"), ("it's", "'it\\'s'"),
        ("~/models/m", "'~/models/m'"), ("a,b", "'a,b'"), ("${oc.env:HOME}", "'${oc.env:HOME}'"), ("", "''"),
    ],
)
def test_format_value(value, text):
    assert format_value(value) == text


@pytest.mark.parametrize("value", [True, None, 3, 2.5e-7, "vllm", "a b", "it's", "true", "123", ["console", "file"]])
def test_format_then_parse_round_trips(value):
    assert parse_value(format_value(value)) == value


def test_plus_prefix_only_for_keys_absent_from_verls_yaml():
    assert not needs_plus("actor_rollout_ref.rollout.gpu_memory_utilization")
    assert not needs_plus("trainer.total_training_steps")
    assert not needs_plus("hydra.run.dir")
    assert needs_plus("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype")
    assert needs_plus("fake.mode")
    assert override("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype", "fp8") == \
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=fp8"
    assert override("actor_rollout_ref.rollout.n", 5) == "actor_rollout_ref.rollout.n=5"


def test_whitelist_refuses_unknown_keys_and_bad_key_syntax():
    assert build_overrides({"a.b": 1}, allowed={"a.b"}) == ["+a.b=1"]
    with pytest.raises(ConfigError, match="trainer.foo"):
        build_overrides({"a.b": 1, "trainer.foo": 2}, allowed={"a.b"})
    with pytest.raises(ConfigError, match="not a valid verl config key"):
        build_overrides({"a.b=1 c": 1})
    with pytest.raises(ConfigError):
        build_overrides({"a;rm -rf /": 1})


def test_base_config_yaml_nested_flat_and_exponents(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(
        "data:\n  train_files: /d/train.parquet\n  train_batch_size: 256\n"
        "actor_rollout_ref.model.path: Qwen/Qwen3-0.6B\n"
        "actor_rollout_ref.actor.optim.lr: 1e-6\n"
        "trainer:\n  n_gpus_per_node: 2\n  logger: [console, file]\n"
    )
    cfg = load_base_config(path)
    assert cfg == {
        "data.train_files": "/d/train.parquet", "data.train_batch_size": 256,
        "actor_rollout_ref.model.path": "Qwen/Qwen3-0.6B", "actor_rollout_ref.actor.optim.lr": 1e-6,
        "trainer.n_gpus_per_node": 2, "trainer.logger": ["console", "file"],
    }


def test_base_config_list_of_overrides_and_json(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text("- data.train_files=/d/train.parquet\n- +actor_rollout_ref.rollout.engine_kwargs.vllm.x=1\n"
                    "- trainer.logger=[console,file]\n- actor_rollout_ref.actor.optim.lr=3e-6\n")
    cfg = load_base_config(path)
    assert cfg["actor_rollout_ref.rollout.engine_kwargs.vllm.x"] == 1
    assert cfg["trainer.logger"] == ["console", "file"] and cfg["actor_rollout_ref.actor.optim.lr"] == 3e-6
    jpath = tmp_path / "base.json"
    jpath.write_text(json.dumps({"data": {"train_batch_size": 64}}))
    assert load_base_config(jpath) == {"data.train_batch_size": 64}


@pytest.mark.parametrize("text, match", [("- ~trainer.logger\n", "deletions"), ("- novalue\n", "KEY=VALUE"),
                                         ("42\n", "mapping"), ("a: [\n", "invalid YAML")])
def test_base_config_errors(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_base_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_base_config(tmp_path / "missing.yaml")


def test_parse_override():
    assert parse_assignment("++a.b='x y'") == ("a.b", "x y")
    assert parse_assignment("a.b=null") == ("a.b", None)


def test_entrypoint_split_resolves_python_and_relative_scripts(tmp_path, monkeypatch):
    import sys

    (tmp_path / "wrap.sh").write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    argv = split_entrypoint("python wrap.sh --flag 'quoted arg'")
    assert argv == [sys.executable, str(tmp_path / "wrap.sh"), "--flag", "quoted arg"]
    assert split_entrypoint(None)[1:] == ["-m", "verl.trainer.main_ppo"]
    assert split_entrypoint("docker run img python3 -m verl.trainer.main_ppo")[0] == "docker"
    with pytest.raises(ConfigError):
        split_entrypoint("   ")
