"""The health rules' registry: every rule raises its events under the name it is registered with, and a rule's
kind is what the readers of health events act on (the monitor, stage 2's collapse signals, the stage-3
diagnosis, the rules agents), so a new rule is one registered function."""

from __future__ import annotations

import math

import pytest

from mart.nodes.agents.schedule import diagnose
from mart.nodes.health_rules import HealthConfig, evaluate
from mart.state.health import HEALTH_RULES, INSTABILITY, register_rule, rule_names
from mart.state.metrics import StepRecord
from mart.state.models import HealthEvent
from mart.state.objectives import collapse_signals


def stream(n: int, agent: int | None = None, **series) -> list[StepRecord]:
    """Records 1..n; ``series``: metric name (``/`` written ``__``) -> step -> value; under ``agent<i>/`` when
    ``agent`` is given (with a second, healthy agent beside it)."""
    out = []
    for s in range(1, n + 1):
        data = {k.replace("__", "/"): f(s) for k, f in series.items()}
        if agent is not None:
            data = {f"agent{agent}/{k}": v for k, v in data.items()}
            data[f"agent{1 - agent}/actor/entropy"] = 1.0
        out.append(StepRecord(step=s, data=data))
    return out


# one stream per registered rule that makes it fire (stage, records, config); a new rule needs its case here
HEALTHY_REWARD = {"critic__score__mean": lambda s: 0.3 + 0.01 * s}
CASES = {
    "nan": ("learning", stream(3, actor__pg_loss=lambda s: math.nan if s == 3 else 0.1), HealthConfig()),
    "entropy_collapse": ("learning", stream(8, actor__entropy=lambda s: 1.0 if s < 4 else 0.01), HealthConfig()),
    "kl_blowup": ("learning", stream(8, actor__ppo_kl=lambda s: 0.01 if s < 4 else 5.0), HealthConfig()),
    "grad_norm_explosion": ("learning", stream(8, actor__grad_norm=lambda s: 1.0 if s < 4 else 100.0), HealthConfig()),
    "reward_collapse": ("learning", stream(9, critic__score__mean=lambda s: 0.8 if s < 5 else 0.1), HealthConfig()),
    "reward_stagnation": ("learning", stream(20, critic__score__mean=lambda s: 0.5), HealthConfig()),
    "response_clipping": ("learning", stream(8, response_length__clip_ratio=lambda s: 0.1 + 0.05 * s),
                          HealthConfig()),
    "memory_margin": ("system", stream(3, perf__max_memory_allocated_gb=lambda s: 10.0 * s),
                      HealthConfig(memory_limit_gb=25.0)),
    "agent_copying": ("learning", stream(8, agent=0, copy_rate=lambda s: 0.95, actor__entropy=lambda s: 1.0),
                      HealthConfig()),
    "reward_concentration": ("learning", stream(8, agent=0, reward_share=lambda s: 0.97, actor__entropy=lambda s: 1.0),
                             HealthConfig()),
    "stale_debate_rounds": ("learning", [StepRecord(s, {**r.data, "workflow/answer_change_rate": 0.0})
                                         for s, r in enumerate(stream(12, agent=0, actor__entropy=lambda s: 1.0), 1)],
                            HealthConfig()),
}


def test_every_registered_rule_raises_its_events_under_its_name():
    assert set(CASES) == set(HEALTH_RULES), "each registered rule needs a stream that fires it in CASES"
    for name, (stage, records, cfg) in CASES.items():
        fired = {e.rule for e in evaluate(stage, "t", records, cfg)}
        assert name in fired, (name, fired)
        for other in {"system", "learning"} - set(HEALTH_RULES[name].stages):  # only in its own stages
            assert name not in {e.rule for e in evaluate(other, "t", records, cfg)}, (name, other)


@pytest.fixture
def toy_rule():
    """A rule registered for this test only: an instability read from ``actor/toy``."""

    @register_rule("toy_spike", kind=INSTABILITY, stages=("learning",))
    def toy_spike(trial_id: str, records: list[StepRecord], cfg: HealthConfig) -> HealthEvent | None:
        high = [r for r in records if r.data.get("actor/toy", 0.0) > 1.0]
        if not high:
            return None
        return HealthEvent(trial_id=trial_id, step=high[-1].step, rule="toy_spike", severity="warn",
                           message="toy metric above 1", value=high[-1].data["actor/toy"])

    yield toy_spike
    HEALTH_RULES.pop("toy_spike")


def test_a_new_rule_of_a_kind_reaches_every_reader_of_that_kind(toy_rule):
    records = stream(6, actor__toy=lambda s: 5.0 if s > 3 else 0.0, actor__entropy=lambda s: 1.0)
    # the monitor runs it, on a trial's stream and on each agent's own
    assert "toy_spike" in {e.rule for e in evaluate("learning", "t", records, HealthConfig())}
    team = stream(6, agent=1, actor__toy=lambda s: 5.0 if s > 3 else 0.0)
    assert ("toy_spike", 1) in {(e.rule, e.agent) for e in evaluate("learning", "t", team, HealthConfig())}
    assert "toy_spike" not in {e.rule for e in evaluate("system", "t", records, HealthConfig())}
    # its events mark the trajectory unhealthy in stage 2/3, and the diagnosis counts them as instability
    assert "health: toy_spike" in collapse_signals(records, ["toy_spike"], noise=None)
    assert "instability" in diagnose(records, ["toy_spike"]).severity
    assert "toy_spike" in rule_names(INSTABILITY)


def test_an_unknown_or_warning_only_rule_is_no_collapse_signal():
    records = stream(6, actor__entropy=lambda s: 1.0)
    assert collapse_signals(records, ["reward_stagnation", "memory_margin", "no_such_rule"], noise=None) == []
    assert "instability" not in diagnose(records, ["reward_stagnation"]).severity


def test_a_rule_name_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        register_rule("nan", kind=INSTABILITY, stages=("learning",))(lambda *a: None)


def test_the_rules_proposer_answers_a_new_instability_rule_by_lowering_the_lr(toy_rule):
    from mart.nodes.agents.base import AgentContext
    from mart.nodes.agents.rules import RulesProposer
    from mart.state.models import TrialRecord, TrialStatus
    from tests.support.toy_backend import LR, SPACE

    history = [TrialRecord(trial_id="l1", stage="learning", kind="baseline", config=SPACE.defaults(),
                           status=TrialStatus.COMPLETED, score=0.5)]

    def first(rule: str | None):
        ctx = AgentContext(stage="learning", objective="x", search_space=SPACE, base_config=SPACE.defaults(),
                           best_overrides={}, profile=None, history=history, memory_limit_gb=3.0,
                           predict_memory=lambda c: None, num_candidates=3)
        if rule:
            ctx.health_events = [HealthEvent(trial_id="l1", step=5, rule=rule, severity="warn", message="x")]
        return RulesProposer().propose(ctx)[0].overrides.get(LR, SPACE[LR].default)

    assert first(None) > SPACE[LR].default  # no finding: the prior raises the lr
    assert first("toy_spike") < SPACE[LR].default
