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



def test_a_large_negative_kl_estimate_is_a_blow_up_too():
    # verl's ppo_kl (and kl_loss with the k1 estimator) can go negative; a sustained large negative value is a
    # policy far from the one that sampled (or the reference), so it stops the trial like a large positive one
    cfg = HealthConfig(window=2)
    ev = evaluate("learning", "t", stream(6, **{**HEALTHY, "kl": lambda s: 0.01 if s < 5 else -3.0}), cfg)
    assert "kl_blowup" in rules(ev, "stop")
    assert "|ppo_kl| 3 > 1 (ppo_kl -3)" in next(e.message for e in ev if e.rule == "kl_blowup")
    # a small negative estimate is the k1 estimator's ordinary noise, not a blow-up
    small = {**HEALTHY, "kl": lambda s: -0.05 if s % 2 else 0.05}
    assert "kl_blowup" not in rules(evaluate("learning", "t", stream(12, **small), cfg))

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


def test_entropy_collapse_is_relative_to_the_trials_own_early_level():
    cfg = HealthConfig(window=3, warmup=2)
    # early level 1.0; 0.1 is below 0.15 x 1.0 -> stops after three low steps. A reference taken over the
    # whole stream (or its end) would sit near 0.46 (or 0.1) and miss this collapse.
    sharp = {**HEALTHY, "entropy": lambda s: 1.0 if s <= 2 else 0.1}
    ev = evaluate("learning", "t", stream(5, **sharp), cfg)
    assert rules(ev, "stop") == {"entropy_collapse"}
    assert "early 1" in next(e.message for e in ev if e.rule == "entropy_collapse")
    # a model whose entropy is low from the start has not collapsed: the reference is its own early level
    low = {**HEALTHY, "entropy": lambda s: 0.1}
    assert "entropy_collapse" not in rules(evaluate("learning", "t", stream(10, **low), cfg))
    # just above 0.15 x early is not a collapse
    edge = {**HEALTHY, "entropy": lambda s: 1.0 if s <= 2 else 0.16}
    assert "entropy_collapse" not in rules(evaluate("learning", "t", stream(8, **edge), cfg))


def test_response_clipping_needs_a_rise_not_only_a_high_level():
    cfg = HealthConfig(window=3)
    # persistently above the 0.2 limit but falling (the model learns to stop in time): no event
    falling = {**HEALTHY, "clip": lambda s: 0.9 - 0.05 * s}
    assert "response_clipping" not in rules(evaluate("learning", "t", stream(10, **falling), cfg))
    rising = {**HEALTHY, "clip": lambda s: 0.25 + 0.01 * s}
    assert "response_clipping" in rules(evaluate("learning", "t", stream(10, **rising), cfg), "stop")
    # rising but under the limit: fine
    low = {**HEALTHY, "clip": lambda s: 0.01 * s}
    assert "response_clipping" not in rules(evaluate("learning", "t", stream(10, **low), cfg))


def test_nan_is_seen_even_when_a_later_step_arrived_in_the_same_read():
    recs = stream(5, **HEALTHY)
    recs[3] = StepRecord(step=4, data={**recs[3].data, "actor/pg_loss": math.nan})
    assert "nan" in rules(evaluate("learning", "t", recs, HealthConfig()), "stop")


def test_a_single_non_finite_grad_norm_does_not_stop():
    recs = stream(5, **HEALTHY)
    recs[4] = StepRecord(step=5, data={**recs[4].data, "actor/grad_norm": math.inf})
    assert rules(evaluate("learning", "t", recs, HealthConfig()), "stop") == set()


def test_memory_margin_remembers_a_spike_that_fell_back():
    spike = stream(5, mem=lambda s: 4.0 if s == 2 else 3.0)
    ev = evaluate("system", "t", spike, HealthConfig(memory_limit_gb=3.5))
    assert rules(ev, "stop") == {"memory_margin"}
    assert ev[0].step == 2 and ev[0].value == 4.0


def test_grad_norm_reference_is_the_early_median():
    cfg = HealthConfig(window=3, warmup=2, grad_norm_factor=10.0)
    # early grad norms 1 and 3: median 2, limit 20. 25 persists -> stop (against the early max, 3 -> 30, it would not)
    spiky = {**HEALTHY, "grad": lambda s: {1: 1.0, 2: 3.0}.get(s, 25.0)}
    assert "grad_norm_explosion" in rules(evaluate("learning", "t", stream(6, **spiky), cfg), "stop")
    calm = {**HEALTHY, "grad": lambda s: {1: 1.0, 2: 3.0}.get(s, 15.0)}
    assert "grad_norm_explosion" not in rules(evaluate("learning", "t", stream(6, **calm), cfg))


def test_a_rising_reward_is_no_collapse_from_its_later_best():
    """Seen in a debate session's per-agent stream: three early steps at 0.2 and a best of 0.55 later were
    read as a collapse (the run of low values came before the best), stopping every stage-2 trial."""
    cfg = HealthConfig(window=3)
    rising = {**HEALTHY, "reward": lambda s: 0.2 if s <= 3 else 0.5 + 0.05 * (s % 2)}
    assert "reward_collapse" not in rules(evaluate("learning", "t", stream(12, **rising), cfg))
    # the same start, then a real fall below half the best: a collapse
    fall = {**HEALTHY, "reward": lambda s: 0.2 if s <= 3 else 0.55 if s <= 8 else 0.1}
    assert "reward_collapse" in rules(evaluate("learning", "t", stream(12, **fall), cfg), "stop")


def test_a_reward_that_falls_to_zero_is_a_collapse_measured_against_its_best():
    # every answer wrong from step 6 on: the recent level is 0, the best so far 0.5 (the rule's reference)
    cfg = HealthConfig(window=3)
    zero = {**HEALTHY, "reward": lambda s: 0.5 if s <= 5 else 0.0}
    [event] = [e for e in evaluate("learning", "t", stream(10, **zero), cfg) if e.rule == "reward_collapse"]
    assert event.severity == "stop" and "best 0.5" in event.message, event.message
