"""The one reader of config values: KEY=VALUE by Hydra's override grammar, files by OmegaConf's YAML loader."""

from __future__ import annotations

import json
import math
import re

import pytest

from mart.state.config_values import (
    RULES,
    flatten,
    format_value,
    load_config_file,
    load_config_text,
    parse_assignment,
    parse_assignments,
    parse_value,
    split_assignments,
)
from mart.state.search_space import ConfigError
from tests.support.paths import REPO


def same(a, b) -> bool:
    """Equal and of the same type, element by element (True == 1 but a bool is not an int here)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("text, kv, in_yaml, why", RULES, ids=[r[0] for r in RULES])
def test_the_rules_table_holds_for_both_readers(text, kv, in_yaml, why):
    assert same(parse_value(text), kv), (text, parse_value(text))
    assert same(load_config_text(f"k: {text}\n")["k"], in_yaml), (text, load_config_text(f"k: {text}\n"))


@pytest.mark.parametrize(
    "text, value",
    [
        ("yes", "yes"), ("no", "no"), ("None", "None"), ("null", None), ("NULL", None), ("true", True),
        ("True", True), ("FALSE", False), ("[1,2]", [1, 2]), ("'3'", "3"), ('"3"', "3"), ("3", 3),
        ("0x10", "0x10"), ("1e-4", 1e-4), ("1e5", 1e5), ("-3", -3), (".5", 0.5), ("1_000", 1000),
        ("'a b'", "a b"), ("'it\\'s'", "it's"), ('"x,y"', "x,y"), ("'true'", "true"),
        ('["console","wandb"]', ["console", "wandb"]), ("['console','wandb']", ["console", "wandb"]),
        ("[console,wandb]", ["console", "wandb"]), ("[]", []), ("{a:1,b:[x]}", {"a": 1, "b": ["x"]}),
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"), ("/data/gsm8k/train.parquet", "/data/gsm8k/train.parquet"),
        ("${oc.env:HOME}", "${oc.env:HOME}"), ("", ""), (" low_var_kl ", "low_var_kl"),
    ],
)
def test_key_value_follows_hydras_override_grammar(text, value):
    assert same(parse_value(text), value), parse_value(text)


def test_nan_and_inf_are_floats():
    assert math.isnan(parse_value("nan")) and parse_value("inf") == math.inf and parse_value("-inf") == -math.inf


def test_plus_prefixes_name_the_same_key():
    assert parse_assignment("+a.b=1") == ("a.b", 1)
    assert parse_assignment("++a.b='x y'") == ("a.b", "x y")
    assert parse_assignments(["a=1", "+b=[1,2]", "a=2"]) == {"a": 2, "b": [1, 2]}  # a later item wins


@pytest.mark.parametrize(
    "item, words",
    [
        ("~trainer.logger", "deletions (~KEY) are not supported"),
        ("~trainer.logger=[console]", "deletions (~KEY) are not supported"),
        ("data.train_batch_size", "expected KEY=VALUE"),
        ("c=x=y", "not a valid KEY=VALUE in Hydra's override grammar"),
        ("a=1,2", "is a Hydra sweep"),
        ("a=choice(1,2)", "is a Hydra sweep"),
        ("a=range(1,5)", "is a Hydra sweep"),
        ("a@pkg=1", "@package is not supported"),
        ("a/b=1", "not a valid verl config key"),
        ("a b=1", "not a valid KEY=VALUE"),
    ],
)
def test_refused_assignments_name_the_item_and_the_rule(item, words):
    with pytest.raises(ConfigError, match=re.escape(words)) as err:
        parse_assignment(item)
    assert repr(item) in str(err.value) or item.split("=")[0] in str(err.value)


def test_split_assignments_keeps_quotes_and_brackets_together():
    assert split_assignments("a=1 b='x y'\nc=[1, 2]  d={k: v} e=\"p q\" f='it\\'s here'") == [
        "a=1", "b='x y'", "c=[1, 2]", "d={k: v}", 'e="p q"', "f='it\\'s here'"]
    assert parse_assignments(split_assignments("b='x y' c=[1, 2]")) == {"b": "x y", "c": [1, 2]}
    assert split_assignments("   ") == []


@pytest.mark.parametrize(
    "value",
    [True, False, None, 3, -7, 2.5e-7, 0.1, "vllm", "a b", "it's", "true", "yes", "None", "123", "0x10", "1e-4",
     "", "a,b", "x=y", "${oc.env:HOME}", ["console", "wandb"], [1, 2.5, True], {"a": 1, "b": "x y"},
     # backslashes: literal unless before a quote or the end (Windows paths, regexes, escapes in prompts)
     "a\\b", "c:\\dir\\", "a \\\\ b", "x\\'y", "\\\\'", "''", "end\\"],
)
def test_format_then_parse_round_trips(value):
    assert same(parse_value(format_value(value)), value), format_value(value)


def test_files_nested_flat_and_list_forms(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-4\n"
                 "data.train_batch_size: 8\ntrainer:\n  logger: [console, wandb]\n  project_name: '3'\n"
                 "x.interp: ${oc.env:HOME}\n")
    assert load_config_file(y) == {"actor_rollout_ref.actor.optim.lr": 1e-4, "data.train_batch_size": 8,
                                   "trainer.logger": ["console", "wandb"], "trainer.project_name": "3",
                                   "x.interp": "${oc.env:HOME}"}  # interpolations are verl's to resolve
    lst = tmp_path / "l.yaml"
    lst.write_text("- data.train_files=/d/train.parquet\n- +x.y=yes\n- trainer.logger='[\"a\"]'\n")
    assert load_config_file(lst) == {"data.train_files": "/d/train.parquet", "x.y": "yes", "trainer.logger": '["a"]'}
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"data": {"train_batch_size": 64}, "a.b": None, "lr": 1e-4}))
    assert load_config_file(j) == {"data.train_batch_size": 64, "a.b": None, "lr": 1e-4}
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert load_config_file(tmp_path / "empty.yaml") == {}


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("s.yaml", "42\n", "must hold a mapping of KEY: VALUE or a list of KEY=VALUE overrides"),
        ("s.yaml", "just text\n", "must hold a mapping"),
        ("b.yaml", "a: [\n", "invalid YAML"),
        ("d.yaml", "a: 1\na: 2\n", "duplicate key"),
        ("l.yaml", "- ~trainer.logger\n", "deletions"),
        ("l.yaml", "- novalue\n", "expected KEY=VALUE"),
        ("k.yaml", "'a;rm -rf /': 1\n", "not a valid verl config key"),
        ("j.json", "{'a': 1}", "invalid JSON"),
    ],
)
def test_bad_files_are_refused_naming_the_file(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(words)) as err:
        load_config_file(path)
    assert name in str(err.value)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config_file(tmp_path / "missing.yaml")


def test_docs_show_the_rules_table():
    """docs/configs.md's table has one row per rule, with the values the readers give."""
    doc = (REPO / "docs" / "configs.md").read_text()
    for text, kv, in_yaml, _ in RULES:
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{text}` |")), None)
        assert row is not None, f"docs/configs.md lacks a row for {text!r}"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"`{kv!r}`" and cells[2] == f"`{in_yaml!r}`", (row, kv, in_yaml)


def test_a_backslash_is_written_the_way_hydra_reads_it():
    # issue 28: a backslash not before a quote was doubled (a\b became a\\b on verl's command line)
    assert format_value("a\\b") == "'a\\b'" and parse_value("'a\\b'") == "a\\b"
    assert format_value("it's") == "'it\\'s'"


def test_flatten_keeps_an_empty_mapping_as_a_value():
    # verl's engine_kwargs: {} means "no extra engine options"; dropping the key changes nothing visible until a
    # base config that needs it is exported without it
    assert flatten({"rollout": {"engine_kwargs": {}, "n": 4}}) == {"rollout.engine_kwargs": {}, "rollout.n": 4}
    assert load_config_text("rollout:\n  engine_kwargs: {}\n") == {"rollout.engine_kwargs": {}}


@pytest.mark.parametrize("text, value", [("false", False), ("False", False), ("0", False), ("no", False),
                                         ("true", True), ("1", True), ("yes", True)])
def test_a_bool_knob_reads_its_string_forms(text, value):
    from mart.state.search_space import ParamSpec

    spec = ParamSpec("trainer.x", "system", "bool", True, "a switch")
    assert spec.validate(text) is value  # bool("false") would be True


def test_a_bool_knob_refuses_other_text():
    from mart.state.search_space import ParamSpec

    with pytest.raises(ConfigError, match="must be a bool"):
        ParamSpec("trainer.x", "system", "bool", True, "a switch").validate("maybe")
