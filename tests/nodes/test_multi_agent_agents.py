"""The agents on multi-agent jobs: a per-agent finding moves that agent's knobs, reward concentration re-shapes
the reward, stale rounds cut rounds, and the LLM prompt lists the per-agent findings and pathologies."""

from __future__ import annotations

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.prompts import build_critic_prompt, build_proposer_prompt
from mart.nodes.agents.rules import RulesProposer, agent_findings
from mart.nodes.agents.schemas import CandidateCheck
from mart.state.agents import NUM_ROUNDS, SHAPING_ALPHA, SHAPING_MODE, agent_knob
from mart.state.ledger import Ledger
from mart.state.models import Candidate, HealthEvent, TrialRecord, TrialStatus
from mart.state.search_space import ParamSpec, SearchSpace


def lr(i):
    return agent_knob(i, "actor.optim.lr")


def kl(i):
    return agent_knob(i, "actor.kl_loss_coef")


def ent(i):
    return agent_knob(i, "actor.entropy_coeff")


def temp(i):
    return agent_knob(i, "rollout.temperature")


SPACE = SearchSpace(backend="multi", params=[
    *[p for i in range(3) for p in (
        ParamSpec(lr(i), "learning", "log", 1e-3, f"agent {i} learning rate", low=1e-5, high=1e-1),
        ParamSpec(kl(i), "learning", "float", 0.01, f"agent {i} KL coefficient", low=0.0, high=0.5),
        ParamSpec(ent(i), "learning", "float", 0.0, f"agent {i} entropy bonus", low=0.0, high=0.05),
        ParamSpec(temp(i), "learning", "float", 1.0, f"agent {i} temperature", low=0.5, high=1.5),
    )],
    ParamSpec(NUM_ROUNDS, "learning", "int", 2, "debate rounds", low=1, high=4),
    ParamSpec(SHAPING_MODE, "learning", "categorical", "margin", "shaping mode", choices=("margin", "quality")),
    ParamSpec(SHAPING_ALPHA, "learning", "float", 0.2, "shaping alpha", low=0.0, high=1.0),
])

BASELINE = TrialRecord(trial_id="l1", stage="learning", kind="baseline", config=SPACE.defaults(),
                       status=TrialStatus.COMPLETED, score=0.5)


def ctx(events=(), k=3) -> AgentContext:
    return AgentContext(stage="learning", objective="score", search_space=SPACE, base_config=SPACE.defaults(),
                        best_overrides={}, profile=None, history=[BASELINE], health_events=list(events),
                        num_candidates=k)


def event(rule, agent=None, severity="stop", trial="l1", step=9, message=None):
    text = message or (f"agent {agent}: {rule} at step {step}" if agent is not None else f"{rule} at step {step}")
    return HealthEvent(trial_id=trial, step=step, rule=rule, severity=severity, message=text, agent=agent)


def changed(cand):
    return set(cand.overrides)


def test_an_unstable_agent_gets_its_own_lr_lowered_and_kl_raised():
    cands = RulesProposer().propose(ctx([event("kl_blowup", agent=1)]))
    first, second = cands[0], cands[1]
    assert changed(first) == {lr(1)} and first.overrides[lr(1)] < SPACE[lr(1)].default
    assert "agent 1" in first.rationale and "lower its learning rate" in first.rationale
    assert changed(second) == {kl(1)} and second.overrides[kl(1)] > SPACE[kl(1)].default
    # the healthy agents' knobs are not what the proposer leads with
    assert all(not (changed(c) & {lr(0), lr(2), kl(0), kl(2)}) for c in cands[:2])


def test_the_named_agent_decides_which_knobs_move():
    for sick in (0, 2):
        first = RulesProposer().propose(ctx([event("grad_norm_explosion", agent=sick)]))[0]
        assert changed(first) == {lr(sick)}, sick


def test_an_agent_whose_entropy_collapsed_gets_an_entropy_bonus():
    cands = RulesProposer().propose(ctx([event("entropy_collapse", agent=2)]))
    assert changed(cands[0]) == {ent(2)} and cands[0].overrides[ent(2)] > 0
    assert {lr(2), temp(2)} & set().union(*(changed(c) for c in cands[1:]))


def test_a_copying_agent_gets_more_diversity():
    cands = RulesProposer().propose(ctx([event("agent_copying", agent=0, severity="warn")]))
    assert changed(cands[0]) in ({ent(0)}, {temp(0)})
    assert "agent 0 showed agent_copying" in cands[0].rationale


def test_reward_concentration_reshapes_the_reward():
    cands = RulesProposer().propose(ctx([event("reward_concentration", agent=0, severity="warn")]))
    assert [changed(c) for c in cands] == [{SHAPING_MODE}, {SHAPING_ALPHA}, {SHAPING_ALPHA}]
    assert cands[0].overrides[SHAPING_MODE] == "quality"
    assert sorted(c.overrides[SHAPING_ALPHA] for c in cands[1:]) == [0.1, 0.4]  # both ways: trials decide
    assert all("concentrated on agent(s) 0" in c.rationale for c in cands)


def test_stale_rounds_cut_rounds():
    cands = RulesProposer().propose(ctx([event("stale_debate_rounds", severity="warn")]))
    assert changed(cands[0]) == {NUM_ROUNDS} and cands[0].overrides[NUM_ROUNDS] == 1


def test_without_findings_the_same_move_goes_to_every_agent():
    calm = RulesProposer().propose(ctx(k=6))
    first = calm[0]
    # one trial moves the learning rate of all three agents, the same way
    assert changed(first) == {lr(0), lr(1), lr(2)}
    assert all(first.overrides[lr(i)] == 2 * SPACE[lr(i)].default for i in range(3))
    assert "all 3 agents" in first.rationale
    # a lone agent's move ranks below the team's and below a round more (one round, not twice as many)
    lone = [c for c in calm if len(changed(c)) == 1 and changed(c) <= {lr(0), lr(1), lr(2)}]
    rounds = next(c for c in calm if changed(c) == {NUM_ROUNDS})
    assert rounds.overrides[NUM_ROUNDS] == 3
    assert all(c.expected_gain < rounds.expected_gain < first.expected_gain for c in lone)
    # findings from another stage's trials do not count
    other = event("kl_blowup", agent=1, trial="s1")
    assert not agent_findings(ctx([other]))
    assert [c.overrides for c in RulesProposer().propose(ctx([other], k=6))] == [c.overrides for c in calm]


def test_prompts_list_per_agent_findings_and_pathologies():
    evs = [event("entropy_collapse", agent=1, message="agent 1: entropy 0.01 < 0.15 x early 1.2; agents 0, 2 are healthy"),
           event("reward_concentration", agent=0, severity="warn", step=7,
                 message="agent 0: takes 96% of the team's reward"),
           event("stale_debate_rounds", severity="warn", step=8, message="debate rounds changed no answer")]
    c = ctx(evs)
    text = build_proposer_prompt(c)[1].content
    section = text.split("# Multi-agent job (agents 0, 1, 2)")[1]
    health, patho = section.split("Multi-agent pathologies")
    assert "l1 step 9: agent1/entropy_collapse (stop): agent 1: entropy 0.01" in health
    assert "agents 0, 2 are healthy" in health
    assert "agent0/reward_concentration (warn): agent 0: takes 96%" in patho
    assert "stale_debate_rounds (warn)" in patho
    assert "re-shape the reward" in section and "that agent's own knobs" in section
    assert "agent1/entropy_collapse@9(stop)" in text  # the history table names the agent too
    cand = Candidate(candidate_id="c1", stage="learning", overrides={lr(1): 5e-4})
    critic = build_critic_prompt(c, [cand], {"c1": CandidateCheck()})[1].content
    assert "agent1/entropy_collapse (stop)" in critic


def test_single_agent_prompts_have_no_multi_agent_section():
    single = SearchSpace(backend="one", params=[SPACE[NUM_ROUNDS]])
    c = AgentContext(stage="learning", objective="score", search_space=single, base_config=single.defaults(),
                     best_overrides={}, profile=None, history=[BASELINE],
                     health_events=[event("entropy_collapse")])
    assert "Multi-agent" not in build_proposer_prompt(c)[1].content


def test_the_ledger_keeps_each_agents_event(tmp_path):
    ledger = Ledger(tmp_path / "m.sqlite")
    evs = [event("entropy_collapse", agent=a) for a in (0, 1)] + [event("entropy_collapse")]
    ledger.add_health_events(evs)
    ledger.add_health_events(evs)  # a re-run upserts, never duplicates
    back = ledger.health_events("l1")
    assert sorted((e.agent is None, e.agent) for e in back) == [(False, 0), (False, 1), (True, None)]
    assert {e.message for e in back} == {e.message for e in evs}
