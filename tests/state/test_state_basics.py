"""Search-space validation, metric tailing and objectives."""

from __future__ import annotations

import math

import pytest

from mart.state.metrics import parse_line
from mart.state.objectives import system_outcome, throughput_window
from mart.state.search_space import ConfigError, ParamSpec
from mart.trial_runner.metrics import MetricsTail
from tests.support.toy_backend import MB, SPACE


def test_param_spec_validation_names_key_and_rule():
    p = SPACE[MB]
    assert p.validate("8") == 8
    for bad, rule in ((0, "must lie in"), (2.5, "integer"), ("x", "number"), (True, "bool"), (None, "null")):
        with pytest.raises(ConfigError, match=rule) as e:
            p.validate(bad)
        assert MB in str(e.value)
    with pytest.raises(ValueError, match="low <= high"):
        ParamSpec("k", "system", "int", 1, "d", low=5, high=1)
    with pytest.raises(ConfigError, match="not a tunable knob"):
        SPACE.validate_overrides({"trainer.rm_rf": 1})
    with pytest.raises(ConfigError, match="learning-stage knob"):
        SPACE.validate_overrides({"actor_rollout_ref.actor.optim.lr": 0.01}, stage="system")


def test_metrics_tail_reads_only_complete_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read_new() == []
    with open(path, "w") as f:
        f.write('{"step": 1, "data": {"a": 1.0, "b": null}}\n{"step": 2, "data": {"a"')
    recs = tail.read_new()
    assert [r.step for r in recs] == [1] and math.isnan(recs[0].data["b"])
    with open(path, "a") as f:
        f.write(': 2.0}}\nnot json\n')
    assert [(r.step, r.data["a"]) for r in tail.read_new()] == [(2, 2.0)]
    assert tail.read_new() == []
    assert parse_line('{"step": "x", "data": {}}') is None


def test_throughput_window_and_feasibility():
    assert throughput_window(6) == (3, 5)
    assert throughput_window(3) == (1, 3)
    from mart.state.metrics import StepRecord

    recs = [StepRecord(s, {"perf/throughput": 10.0 * s, "actor/perf/max_memory_allocated_gb": 2.0}) for s in range(1, 7)]
    out = system_outcome(recs, 6, limit_gb=1.5)
    assert out.throughput == 40.0 and out.peak_memory_gb == 2.0 and not out.feasible
    assert system_outcome(recs, 6, limit_gb=3.0).feasible
