"""The prompts give the LLM what it needs: objective, knobs, profile, headroom, history, feedback, checks."""

from __future__ import annotations

from mart.nodes.agents.llm import check_candidate
from mart.nodes.agents.prompts import (
    PROMPT_VERSION,
    VERL_PERF_GUIDE,
    build_critic_prompt,
    build_proposer_prompt,
    build_repair_message,
    format_history,
)
from mart.state.models import Candidate, TrialRecord, TrialStatus
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL_SPACE
from tests.support.llm_helpers import GMU, SEQS, SPACE, TP, history, make_ctx


def _text(messages) -> str:
    return "\n".join(m.content for m in messages)


def test_proposer_prompt_contains_the_facts():
    ctx = make_ctx()
    system, user = build_proposer_prompt(ctx)
    assert system.type == "system" and user.type == "human"
    text = user.content
    # the stage, its objective and the number of candidates
    assert "Stage: system" in text and ctx.objective in text and "exactly 3 candidate" in text
    # the search space comes from the catalogue (one source of truth): every stage knob, the constraint
    for line in SPACE.describe("system").splitlines():
        assert line in text
    assert "actor.optim.lr" not in text.split("# Trial history")[0]  # learning knobs are not offered in stage 1
    # the profile: phase shares, the bottleneck, memory headroom to the margin, response lengths
    assert "bottleneck: gen" in text
    assert "gen 64%" in text and "update_actor 24%" in text
    assert "memory limit: 81.00 GB" in text and "headroom to the limit: 11.00 GB" in text
    assert "mean 310" in text and "max 512" in text and "clip ratio 0.07" in text
    # the current best and the history table: diffs vs the baseline, outcomes, health events
    assert f"{SEQS}=512" in text.split("# Current best")[1].split("#")[0]
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| t0")}
    assert set(rows) == {"t001", "t002", "t003 (best)"}
    assert f"{GMU}=0.9" in rows["t002"] and "oom" in rows["t002"] and "memory_trend@2(warn)" in rows["t002"]
    assert "1150" in rows["t003 (best)"] and f"{SEQS}=512" in rows["t003 (best)"]
    assert "baseline" in rows["t001"] and "| - |" in rows["t001"]
    # the reviewer's feedback
    assert "keep gpu_memory_utilization at or below 0.8" in text
    # the output contract is spelled out (json_mode servers see no schema)
    assert '"overrides": [{"key"' in text and "JSON" in text
    assert PROMPT_VERSION


def test_proposer_prompt_without_profile_or_history():
    ctx = make_ctx(profile=None, history=[], health_events=[], feedback=[], best_overrides={})
    text = _text(build_proposer_prompt(ctx))
    assert "No profile yet. Memory limit: 81.00 GB." in text
    assert "No trials yet in this stage." in text
    assert "The baseline (the base configuration, no overrides yet)." in text


def test_verl_prompt_carries_the_perf_guide_order_once():
    ctx = make_ctx(search_space=VERL_SPACE, backend="verl", best_overrides={}, history=[], health_events=[])
    text = _text(build_proposer_prompt(ctx))
    assert text.count("gpu_memory_utilization) and vLLM's max_num_seqs") == 1
    assert "actor_rollout_ref.rollout.gpu_memory_utilization (float in [0.2, 0.95]; default 0.5)" in text
    # a node that already put the perf guide in ctx.notes does not get it twice
    lead_note = "verl perf-guide order: rollout memory share -> smaller rollout TP -> ..."
    text = _text(build_proposer_prompt(make_ctx(search_space=VERL_SPACE, backend="verl", notes=[lead_note])))
    assert lead_note in text and VERL_PERF_GUIDE not in text
    # stage 2 gets no perf guide, and the learning knobs instead of the system ones
    text = _text(build_proposer_prompt(make_ctx(search_space=VERL_SPACE, backend="verl", stage="learning")))
    assert VERL_PERF_GUIDE not in text and "actor_rollout_ref.actor.optim.lr (log in" in text
    assert "gpu_memory_utilization (float" not in text


def test_critic_prompt_contains_checks_predictions_and_history():
    ctx = make_ctx()
    cands = [
        Candidate(candidate_id="c-ok", stage="system", overrides={SEQS: 512, TP: 1}, rationale="TP 1 frees GPUs",
                  source="llm", expected_gain=0.12),
        Candidate(candidate_id="c-constraint", stage="system", overrides={SEQS: 1024}, rationale="more seqs"),
        Candidate(candidate_id="c-bad", stage="system", overrides={"rollout.warp": 3}, rationale="?"),
        Candidate(candidate_id="c-dup", stage="system", overrides={GMU: 0.9}, rationale="again"),
        Candidate(candidate_id="c-over", stage="system", overrides={GMU: 0.8, SEQS: 512}, rationale="more KV"),
    ]
    checks = {c.candidate_id: check_candidate(ctx, c) for c in cands}
    text = _text(build_critic_prompt(ctx, cands, checks))
    blocks = {b.split("`")[1]: b for b in text.split("### Candidate ")[1:]}
    assert "Memory limit (peak GB, (1 - margin) x capacity): 81.00 GB" in text
    assert "predicted peak memory: 75.00 GB (6.00 GB under the limit)" in blocks["c-ok"]
    assert "validation: ok" in blocks["c-ok"] and "constraints: ok" in blocks["c-ok"]
    assert "TP 1 frees GPUs" in blocks["c-ok"] and "+12.0%" in blocks["c-ok"]
    assert "constraints: FAILED: seqs_fit_memory" in blocks["c-constraint"]
    assert "validation: FAILED: `rollout.warp` is not a tunable knob" in blocks["c-bad"]
    assert "already tried: yes" in blocks["c-dup"]
    assert "88.00 GB (7.00 GB OVER the limit)" in blocks["c-over"]
    assert "bottleneck: gen" in text and "| t002 |" in text and "keep gpu_memory_utilization" in text
    assert '"verdicts"' in text and '"pick"' in text


def test_repair_message_quotes_the_errors():
    msg = build_repair_message(["candidate 1: `x` must lie in [0, 1], but got 3."], attempt=1, attempts=3,
                               role="proposer")
    assert "attempt 1 of 3" in msg.content and "`x` must lie in [0, 1], but got 3." in msg.content


def test_history_table_is_compact():
    many = history() + [
        TrialRecord(trial_id=f"t{i:03d}", stage="system", config={**history()[0].config, SEQS: 16 + i},
                    status=TrialStatus.COMPLETED, throughput=900.0 + i, peak_memory_gb=70.0)
        for i in range(4, 40)
    ]
    table = format_history(make_ctx(history=many), max_rows=10)
    lines = [line for line in table.splitlines() if line.startswith("| t0")]
    assert len(lines) == 10
    ids = [line.split("|")[1].strip() for line in lines]
    assert ids[0] == "t001"  # the baseline stays
    assert "t003 (best)" in ids  # so does the best trial (1150 tok/s)
    assert ids[-1] == "t039"  # and the latest
    assert "(29 older trials not shown)" in table


def test_learning_stage_history_summarises_the_system_stage():
    learning = TrialRecord(trial_id="t010", stage="learning", kind="baseline", config=history()[2].config,
                           status=TrialStatus.COMPLETED, score=0.41)
    text = format_history(make_ctx(stage="learning", history=[*history(), learning]))
    rows = [line for line in text.splitlines() if line.startswith("| t0")]
    assert [r.split("|")[1].strip() for r in rows] == ["t010 (best)"]
    assert "system stage: 3 trials; best t003 with throughput 1150" in text
