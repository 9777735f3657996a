"""mart's search on multi-agent jobs: the job model prices async workflow tasks (starved engines vs overlapped
barriers) and moves per-agent copies of a system knob together; stage 2 moves every agent at once, turns
reward shaping on early, tries another round, and keeps a lone agent's move for a finding about it."""

from __future__ import annotations

from dataclasses import replace

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.job_model import JobModel
from mart.nodes.agents.model_search import search
from mart.nodes.agents.rules import RulesProposer
from mart.state.agents import NUM_ROUNDS, SHAPING_ALPHA, SHAPING_MODE, agent_knob
from mart.state.models import HealthEvent, TrialRecord, TrialStatus
from mart.state.search_space import ParamSpec, SearchSpace
from mart.trial_runner.verl.space import SEARCH_SPACE
from tests.nodes.test_job_model import R, base_config, job

ASYNC = "rollout.async_num_tasks"
UTIL = R + "gpu_memory_utilization"


def ma_system_space(per_agent_util: bool = False) -> SearchSpace:
    """verl's catalogue plus the async-task knob; optionally each of two agents owns its memory share."""
    params = [p for p in SEARCH_SPACE.params if not (per_agent_util and p.key == UTIL)]
    if per_agent_util:
        params += [replace(SEARCH_SPACE[UTIL], key=agent_knob(i, UTIL)) for i in range(2)]
    params.append(ParamSpec(ASYNC, "system", "int", 0, "async workflow tasks (0 = synchronous)", low=0, high=2048))
    return SearchSpace(backend="ma", params=params)


def test_async_tasks_starve_the_engines_when_few_and_overlap_the_barriers_when_many():
    model = JobModel(job(), base_config())
    sync = model.predict({}).phase_s["gen"]
    gen = {t: model.predict({ASYNC: t}).phase_s["gen"] for t in (8, 64, 512, 2048)}
    assert gen[8] > sync  # 8 tasks x 8 samples over 8 engines: a handful of sequences per engine
    assert gen[2048] < gen[512] < sync  # many tasks fill the long tail's idle engine steps
    # the training phases do not see the rollout's concurrency
    assert model.predict({ASYNC: 2048}).phase_s["update_actor"] == model.predict({}).phase_s["update_actor"]


def test_a_job_without_the_knob_predicts_exactly_as_before():
    model = JobModel(job(), base_config())
    assert model.predict({}).to_dict() == model.predict({ASYNC: 0}).to_dict()
    found = search(model, SEARCH_SPACE, base_config(), 72.0)
    assert found and all(ASYNC not in s.overrides for s in found)


def test_the_model_search_proposes_async_tasks_and_a_measured_trial_calibrates_them():
    space = ma_system_space()
    model = JobModel(job(), base_config())
    found = search(model, space, base_config(), 72.0, n_out=3)
    assert found and all(s.overrides.get(ASYNC, 0) >= 512 for s in found)
    # a trial measures no gain from the tasks: the model stops promising one near that value
    from mart.nodes.agents.job_model import Observation

    pred = model.predict({ASYNC: 1024})
    sync = model.predict({})
    promised = pred.throughput / sync.throughput - 1
    assert promised > 0.03
    obs = [Observation(config={**base_config(), ASYNC: a}, phases=dict(sync.phase_s), peak_gb=sync.peak_gb)
           for a in (0, 1024)]
    model.fit(obs)
    assert model.predict({ASYNC: 1024}).phase_s["gen"] > pred.phase_s["gen"]
    # kernel-weighted residuals: the measurement at 1024 tasks dominates there (the sync one still weighs in)
    assert model.predict({ASYNC: 1024}).throughput / model.predict({}).throughput - 1 < promised / 2


def test_a_per_agent_system_knob_moves_for_every_agent():
    space = ma_system_space(per_agent_util=True)
    model = JobModel(job(), base_config())
    found = search(model, space, base_config(), 72.0, n_out=3)
    assert found
    for s in found:
        shares = [s.overrides.get(agent_knob(i, UTIL)) for i in range(2)]
        assert UTIL not in s.overrides and shares[0] is not None and shares[0] == shares[1]
    # the model reads the agents' copy back
    assert model.knobs({agent_knob(0, UTIL): 0.8, agent_knob(1, UTIL): 0.8})["util"] == 0.8


# --------------------------------------------------------------------------- stage 2


def lr(i):
    return agent_knob(i, "actor.optim.lr")


def clip(i):
    return agent_knob(i, "actor.clip_ratio_high")


SPACE = SearchSpace(backend="ma", params=[
    *[p for i in range(2) for p in (
        ParamSpec(lr(i), "learning", "log", 1e-6, f"agent {i} learning rate", low=1e-8, high=1e-4),
        ParamSpec(clip(i), "learning", "float", 0.2, f"agent {i} clip-high", low=0.05, high=0.5),
    )],
    ParamSpec(NUM_ROUNDS, "learning", "int", 2, "debate rounds", low=1, high=4),
    ParamSpec(SHAPING_MODE, "learning", "categorical", "none", "shaping mode", choices=("none", "margin", "quality")),
    ParamSpec(SHAPING_ALPHA, "learning", "float", 0.5, "shaping alpha", low=0.0, high=2.0),
])


def ctx(best=None, history=(), events=(), k=6) -> AgentContext:
    base = TrialRecord(trial_id="l1", stage="learning", kind="baseline", config=SPACE.defaults(),
                       status=TrialStatus.COMPLETED, score=0.32)
    return AgentContext(stage="learning", objective="score", search_space=SPACE, base_config=SPACE.defaults(),
                        best_overrides=dict(best or {}), profile=None, history=[base, *history],
                        health_events=list(events), num_candidates=k)


def test_shaping_off_is_turned_on_first_then_every_agents_lr_moves_together():
    cands = RulesProposer().propose(ctx())
    assert cands[0].overrides == {SHAPING_MODE: "margin"} and "MARTI" in cands[0].rationale
    assert cands[1].overrides == {lr(0): 2e-6, lr(1): 2e-6}
    # alpha does nothing while shaping is off; a lone agent's lr waits for a finding about it
    assert all(SHAPING_ALPHA not in c.overrides for c in cands)
    lone = [c for c in cands if set(c.overrides) in ({lr(0)}, {lr(1)})]
    assert all(c.expected_gain < cands[1].expected_gain for c in lone)
    assert any(c.overrides == {NUM_ROUNDS: 3} for c in cands)


def test_with_shaping_on_alpha_moves_both_ways_and_turning_it_off_is_last():
    cands = RulesProposer().propose(ctx(best={SHAPING_MODE: "margin"}, k=12))
    alphas = sorted(c.overrides[SHAPING_ALPHA] for c in cands if set(c.overrides) == {SHAPING_MODE, SHAPING_ALPHA})
    assert alphas and min(alphas) < 0.5 < max(alphas)
    assert not any(c.overrides.get(SHAPING_MODE, "none") == "none" for c in cands[:6])


def test_a_winning_team_step_is_taken_again_but_not_far_past_four_times_the_base():
    won = [TrialRecord(trial_id=f"l{i + 2}", stage="learning", kind="candidate", config={**SPACE.defaults(),
                       lr(0): v, lr(1): v, SHAPING_MODE: "margin"}, status=TrialStatus.COMPLETED, score=0.33 + 0.01 * i)
           for i, v in enumerate((2e-6, 4e-6))]
    cands = RulesProposer().propose(ctx(best={SHAPING_MODE: "margin", lr(0): 4e-6, lr(1): 4e-6}, history=won))
    assert cands[0].overrides[lr(0)] == cands[0].overrides[lr(1)] == 8e-6
    assert "already paid off" in cands[0].rationale
    at8 = [*won, TrialRecord(trial_id="l4", stage="learning", kind="candidate", config={
        **SPACE.defaults(), lr(0): 8e-6, lr(1): 8e-6, SHAPING_MODE: "margin"}, status=TrialStatus.COMPLETED, score=0.36)]
    nxt = RulesProposer().propose(ctx(best={SHAPING_MODE: "margin", lr(0): 8e-6, lr(1): 8e-6}, history=at8))
    # 16x the base for both agents at once ranks below another round
    rounds = next(c for c in nxt if c.overrides.get(NUM_ROUNDS) == 3)
    far = next(c for c in nxt if c.overrides.get(lr(0)) == 1.6e-5 and c.overrides.get(lr(1)) == 1.6e-5)
    assert far.expected_gain < rounds.expected_gain


def test_a_finding_about_one_agent_moves_that_agent_first_not_the_team():
    ev = HealthEvent(trial_id="l1", step=5, rule="kl_blowup", severity="stop", message="agent 1: ppo_kl", agent=1)
    cands = RulesProposer().propose(ctx(events=[ev]))
    assert cands[0].overrides == {lr(1): 5e-7}
    team = [c for c in cands if set(c.overrides) == {lr(0), lr(1)}]
    assert all(c.expected_gain < cands[0].expected_gain for c in team)


def test_single_agent_stage_two_has_no_team_moves():
    single = SearchSpace(backend="one", params=[
        ParamSpec("actor_rollout_ref.actor.optim.lr", "learning", "log", 1e-6, "lr", low=1e-8, high=1e-4),
        ParamSpec("actor_rollout_ref.actor.clip_ratio_high", "learning", "float", 0.2, "clip", low=0.05, high=0.5),
    ])
    c = AgentContext(stage="learning", objective="score", search_space=single, base_config=single.defaults(),
                     best_overrides={}, profile=None, history=[], health_events=[], num_candidates=4)
    cands = RulesProposer().propose(c)
    assert [c.expected_gain for c in cands] == [0.8, 0.45, 0.3, 0.1]  # the single-agent priors, one knob each
    assert all(len(c.overrides) == 1 for c in cands)


def test_after_team_steps_a_lone_agent_step_far_past_the_base_waits_too():
    hist = [TrialRecord(trial_id=f"l{i + 2}", stage="learning", kind="candidate", config={**SPACE.defaults(),
                        lr(0): v, lr(1): v, SHAPING_MODE: "margin"}, status=TrialStatus.COMPLETED, score=0.33 + 0.01 * i)
            for i, v in enumerate((2e-6, 4e-6, 8e-6))]
    cands = RulesProposer().propose(ctx(best={SHAPING_MODE: "margin", lr(0): 8e-6, lr(1): 8e-6}, history=hist, k=12))
    rounds = next(c for c in cands if c.overrides.get(NUM_ROUNDS) == 3)
    lone = [c for c in cands if c.overrides.get(lr(0)) != c.overrides.get(lr(1))]
    assert lone and all(c.expected_gain < rounds.expected_gain for c in lone)


def test_without_a_job_model_per_agent_system_knobs_move_together():
    space = SearchSpace(backend="ma", params=[
        ParamSpec(agent_knob(i, R + "max_num_seqs"), "system", "int", 256, f"agent {i} max seqs", low=16, high=2048)
        for i in range(2)])
    c = AgentContext(stage="system", objective="throughput", search_space=space, base_config=space.defaults(),
                     best_overrides={}, profile=None, history=[], num_candidates=3)
    cands = RulesProposer().propose(c)
    assert cands[0].overrides == {agent_knob(0, R + "max_num_seqs"): 512, agent_knob(1, R + "max_num_seqs"): 512}
    assert "all 2 agents" in cands[0].rationale


def test_without_a_job_model_async_tasks_start_at_marti_s_worker_count():
    space = SearchSpace(backend="ma", params=[
        ParamSpec(ASYNC, "system", "int", 0, "async workflow tasks", low=0, high=2048)])
    c = AgentContext(stage="system", objective="throughput", search_space=space, base_config=space.defaults(),
                     best_overrides={}, profile=None, history=[], num_candidates=3)
    cands = RulesProposer().propose(c)
    assert [x.overrides for x in cands] == [{ASYNC: 512}]
    assert "speeds up" in cands[0].rationale
