"""Stage 3 through the LLM agents against the loopback OpenAI-compatible stub: the prompt carries the diagnosis
and the segment, answers become typed transitions on the learning knobs, bad ones are sent back with mart's
reasons, and the critic sees mart's reading of each transition."""

from __future__ import annotations

import json
import re

import pytest

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.llm import LLMCritic, LLMProposer
from mart.nodes.agents.rules import RulesCritic, RulesProposer
from mart.nodes.agents.schedule import diagnose
from mart.state.models import Candidate, TrialRecord, TrialStatus
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL
from tests.nodes.test_schedule_agents import COLLAPSE, VERL_BASE, trajectory
from tests.support.llm_helpers import SECRET, options, proposal
from tests.support.openai_stub import OpenAIStub, PlausibleAgent, Reply

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_llm_env")]

A = "actor_rollout_ref.actor."
CLIP_HIGH, TEMP, N = A + "clip_ratio_high", "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.n"
MAX_LEN = "data.max_response_length"



@pytest.fixture
def stub():
    with OpenAIStub(default=PlausibleAgent(seed=3), max_lifetime_s=60) as s:
        yield s


def ctx(**kw) -> AgentContext:
    sibling = TrialRecord(trial_id="t9", stage="schedule", config={**VERL.defaults(), **VERL_BASE, N: 16},
                          status=TrialStatus.COMPLETED, score=0.41, parent_step=10)
    args = dict(stage="schedule", objective="final validation score", search_space=VERL,
                base_config={**VERL.defaults(), **VERL_BASE}, best_overrides={}, profile=None, history=[sibling],
                num_candidates=2, diagnosis=diagnose(trajectory(**COLLAPSE)), segment=(10, 20), backend="sim",
                memory_limit_gb=60.0, predict_memory=lambda c: 40.0 * c[MAX_LEN] / 512)
    args.update(kw)
    return AgentContext(**args)


def proposer(stub) -> LLMProposer:
    return LLMProposer(options(stub.base_url), api_key=SECRET, fallback=RulesProposer(), max_retries=0)


def test_prompt_carries_the_diagnosis_segment_and_siblings(stub):
    stub.push(Reply.json(proposal({CLIP_HIGH: 0.28, TEMP: 1.1}, {A + "entropy_coeff": 0.001})))
    cands = proposer(stub).propose(ctx())
    prompt = stub.completions()[0].prompt
    diag = json.loads(re.search(r"null = not measured\)\n(\{.*?\n\})", prompt, re.S).group(1))
    assert diag["entropy_ratio"] < 0.1 and diag["severity"] == {"entropy_collapse": 1.0}
    assert "entropy fell 9" in diag["findings"][0]
    assert "steps 10-20 (from the checkpoint at step 10, 10 steps)" in prompt
    assert f"t9: {N}=16 -> completed, score 0.41" in prompt
    assert "clip-higher (answers entropy_collapse)" in prompt and "arXiv 2503.14476" in prompt
    assert f"- {CLIP_HIGH} (float" in prompt and "gpu_memory_utilization" not in prompt.split("# Learning knobs")[1].split("#")[0]
    assert [c.overrides for c in cands] == [{CLIP_HIGH: 0.28, TEMP: 1.1}, {A + "entropy_coeff": 0.001}]
    assert all(c.source == "llm" and c.stage == "schedule" and c.candidate_id.startswith("llm-sch-") for c in cands)


def test_bad_transitions_are_sent_back_with_mart_reasons(stub):
    stub.push(Reply.json(proposal({N: 16}, {MAX_LEN: 1024}, {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.6})),
              Reply.json(proposal({CLIP_HIGH: 0.3})))
    agent = proposer(stub)
    cands = agent.propose(ctx())
    repair = stub.completions()[1].messages[-1]["content"]
    assert "already tried from this checkpoint" in repair  # the sibling t9
    assert "predicts a peak of 80.00 GB, over the limit 60.00 GB" in repair  # a doubled budget
    assert "is a system-stage knob; it cannot change in the schedule stage" in repair
    assert [c.overrides for c in cands] == [{CLIP_HIGH: 0.3}]


def test_plausible_llm_and_fallback_give_valid_transitions(stub):
    cands = proposer(stub).propose(ctx(num_candidates=3))
    assert cands
    for c in cands:
        VERL.validate_overrides(c.overrides, stage="learning")
        assert VERL.check_constraints({**VERL.defaults(), **VERL_BASE, **c.overrides}) == []
    broken = Reply.json({"analysis": "x", "candidates": []})
    stub.push(broken, broken, broken)
    agent = proposer(stub)
    cands = agent.propose(ctx())
    assert cands and all(c.source == "rules" for c in cands) and "DAPO" in cands[0].rationale
    assert agent.last_calls()[-1].fallback_reason


def test_critic_prompt_shows_mart_reading_and_the_rules_critic_ranks_the_same_way(stub):
    cands = [Candidate(candidate_id="a", stage="schedule", overrides={A + "optim.lr": 5e-7}),
             Candidate(candidate_id="b", stage="schedule", overrides={CLIP_HIGH: 0.28})]
    critic = LLMCritic(options(stub.base_url), api_key=SECRET, fallback=RulesCritic(), max_retries=0)
    verdict = critic.critique(ctx(), cands)
    prompt = stub.completions()[-1].prompt
    assert "# Diagnosis at the checkpoint (steps 10-20" in prompt
    block_b = prompt.split("### Candidate `b`")[1]
    assert "answers (mart's reading): Entropy fell" in block_b and "(clip-higher)" in block_b
    assert "answers (mart's reading): no finding of the diagnosis" in prompt.split("### Candidate `a`")[1]
    assert verdict.pick in {"a", "b"}  # the stub picks the first that passes; the rules critic ranks by finding
    assert RulesCritic().critique(ctx(), cands).pick == "b"


def test_a_longer_limit_from_the_llm_brings_its_token_caps_and_a_bare_cap_move_is_sent_back(stub):
    """The LLM proposes the limit alone: mart adds the dynamic-batch cap the longer limit implies; a cap moved on
    its own (a system knob) goes back with the reason."""
    tight = {**VERL.defaults(), **VERL_BASE, A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": 1100}
    stub.push(Reply.json(proposal({MAX_LEN: 1024}, {A + "ppo_max_token_len_per_gpu": 4096})),
              Reply.json(proposal({CLIP_HIGH: 0.3})))
    cands = proposer(stub).propose(ctx(base_config=tight, predict_memory=lambda c: 40.0))
    repair = stub.completions()[1].messages[-1]["content"]
    assert "may only raise it with data.max_response_length" in repair
    longer = next(c for c in cands if MAX_LEN in c.overrides)
    assert longer.overrides == {MAX_LEN: 1024, A + "ppo_max_token_len_per_gpu": 2200}
    assert not VERL.check_constraints({**tight, **longer.overrides})
