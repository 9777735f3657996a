"""Health rules on synthetic metric streams: each fires on its pathology, persists, and spares healthy runs."""

from __future__ import annotations

import math

from mart.nodes.health_rules import HealthConfig, evaluate
from mart.state.metrics import StepRecord


def stream(n, **series):
    """Records 1..n; each keyword is a function step -> value for one metric name (underscores -> '/')."""
    names = {"entropy": "actor/entropy", "grad": "actor/grad_norm", "reward": "critic/score/mean",
             "kl": "actor/ppo_kl", "clip": "response_length/clip_ratio", "mem": "perf/max_memory_allocated_gb",
             "loss": "actor/pg_loss"}
    return [StepRecord(step=s, data={names[k]: f(s) for k, f in series.items()}) for s in range(1, n + 1)]


def rules(events, severity=None):
    return {e.rule for e in events if severity is None or e.severity == severity}


HEALTHY = dict(entropy=lambda s: 1.0 - 0.01 * s, grad=lambda s: 1.0, reward=lambda s: 0.3 + 0.02 * s,
               kl=lambda s: 0.01, clip=lambda s: 0.02)


def test_healthy_run_raises_nothing():
    assert evaluate("learning", "t", stream(20, **HEALTHY), HealthConfig()) == []


def test_entropy_collapse_warns_then_stops_when_persistent():
    cfg = HealthConfig(window=3)
    collapse = {**HEALTHY, "entropy": lambda s: 1.0 if s <= 4 else 0.05}
    assert rules(evaluate("learning", "t", stream(5, **collapse), cfg)) == {"entropy_collapse"}
    assert rules(evaluate("learning", "t", stream(5, **collapse), cfg), "stop") == set()
    assert rules(evaluate("learning", "t", stream(7, **collapse), cfg), "stop") == {"entropy_collapse"}
    # a dip that recovers is not persistent
    dip = {**HEALTHY, "entropy": lambda s: 0.05 if s in (5, 6) else 1.0}
    assert "entropy_collapse" not in rules(evaluate("learning", "t", stream(8, **dip), cfg))


def test_grad_norm_explosion_kl_blowup_reward_collapse():
    cfg = HealthConfig(window=2)
    assert "grad_norm_explosion" in rules(evaluate(
        "learning", "t", stream(6, **{**HEALTHY, "grad": lambda s: 1.0 if s < 4 else 50.0}), cfg), "stop")
    assert "kl_blowup" in rules(evaluate(
        "learning", "t", stream(6, **{**HEALTHY, "kl": lambda s: 0.01 if s < 5 else 3.0}), cfg), "stop")
    assert "reward_collapse" in rules(evaluate(
        "learning", "t", stream(8, **{**HEALTHY, "reward": lambda s: 0.6 if s < 6 else 0.05}), cfg), "stop")


def test_nan_stops_at_once():
    recs = stream(3, **HEALTHY)
    recs.append(StepRecord(step=4, data={"actor/entropy": math.nan, "actor/pg_loss": math.inf}))
    ev = evaluate("learning", "t", recs, HealthConfig())
    assert rules(ev, "stop") == {"nan"}
    assert "actor/entropy" in ev[0].message


def test_stagnation_is_only_a_warning_and_clipping_needs_a_rise():
    flat = {**HEALTHY, "reward": lambda s: 0.5}
    ev = evaluate("learning", "t", stream(20, **flat), HealthConfig(stagnation_steps=10))
    assert rules(ev) == {"reward_stagnation"} and rules(ev, "stop") == set()
    rising = {**HEALTHY, "clip": lambda s: 0.05 * s}
    assert "response_clipping" in rules(evaluate("learning", "t", stream(10, **rising), HealthConfig()), "stop")


def test_system_stage_checks_memory_margin_only():
    recs = stream(4, mem=lambda s: 1.0 + s, entropy=lambda s: 0.0001)
    ev = evaluate("system", "t", recs, HealthConfig(memory_limit_gb=3.5))
    assert rules(ev, "stop") == {"memory_margin"}
    assert ev[0].value == 5.0 and ev[0].step == 4
    assert evaluate("system", "t", recs, HealthConfig(memory_limit_gb=10)) == []
