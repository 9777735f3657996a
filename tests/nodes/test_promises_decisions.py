"""Issue 46's promises on the decisions, each held by a fast test that fails when the promise is broken (MQ*).

- a candidate predicted over the memory limit is never admitted as "risk low", in any stage (issue 43's repro);
- a batch of proposals never holds the same config twice, nor a config still running;
- the early-look cut never measures a trial against one that went over the memory margin.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.rules import RulesCritic, RulesProposer
from mart.nodes.stages import StageView
from mart.nodes.stages.system import CUT_REASON, EARLY_LOOK_STEP, SystemStage
from mart.state.ledger import Ledger
from mart.state.metrics import THROUGHPUT_KEY, StepRecord
from mart.state.models import Candidate, TrialRecord, config_hash
from mart.state.trials import RunningTrial, TrialHandle

R = "actor_rollout_ref.rollout."
N = R + "n"

# issue 43's repro on the local CPU workload (`mart tune --stages learning --set max_num_seqs=256 --set
# ppo_max_token_len_per_gpu=8192 --set use_dynamic_bsz=true --set enable_gradient_checkpointing=false --approve
# none`, then `mart review RUN --reject "more rollouts per prompt"`): the job model calibrated on that baseline
# predicted these peaks (GB) for rollout.n 8 (the base) and 16, against a limit of 0.0675 GB
REPRO_SETS = {R + "max_num_seqs": 256, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 8192,
              "actor_rollout_ref.actor.use_dynamic_bsz": True,
              "actor_rollout_ref.model.enable_gradient_checkpointing": False}
REPRO_PEAK_GB = {8: 0.0597, 16: 0.0741}
REPRO_LIMIT_GB = 0.0675


def _local_ctx(stage: str, peaks: dict[int, float], limit: float, feedback=(), slots: int = 1) -> AgentContext:
    from mart.trial_runner.local.backend import LocalBackend

    backend = LocalBackend()
    base = {**backend.base_config(), **REPRO_SETS}
    return AgentContext(stage=stage, objective="x", search_space=backend.search_space(), base_config=base,
                        best_overrides={}, profile=None, history=[], feedback=list(feedback), memory_limit_gb=limit,
                        predict_memory=lambda c: peaks[c[N]], num_candidates=3, slots=slots,
                        validate_config=backend.validate_config)


def _never_low_over_the_limit(verdict, limit: float) -> None:
    for c in verdict.critiques:
        if c.predicted_memory_gb is not None and c.predicted_memory_gb > limit:
            assert c.risk != "low", c
            assert not any("risk low" in r for r in c.reasons), c


def test_the_issue_43_candidate_predicted_over_the_limit_is_not_admitted_in_stage_2():
    ctx = _local_ctx("learning", REPRO_PEAK_GB, REPRO_LIMIT_GB, feedback=["reviewer on c0: more rollouts per prompt"])
    cands = RulesProposer().propose(ctx)
    assert any(c.overrides.get(N) == 16 for c in cands), "the setup: the rules propose n=16 on this feedback"
    verdict = RulesCritic().critique(ctx, cands)
    by_n = {cands[i].overrides.get(N): crit for i, crit in enumerate(verdict.critiques)}
    assert not by_n[16].accepted and by_n[16].risk == "high"
    assert "exceeds the limit" in by_n[16].reasons[0]
    _never_low_over_the_limit(verdict, REPRO_LIMIT_GB)


@pytest.mark.parametrize("stage", ["system", "learning", "schedule"])
def test_a_candidate_predicted_over_the_limit_is_never_admitted_as_risk_low(stage):
    # a small job (limit well under 0.5 GB): over the limit by a little, or over it as the stage's base config is
    for peaks in ({8: 0.0597, 16: 0.0741}, {8: 0.07, 16: 0.0705}, {8: 0.0597, 16: 0.0676}):
        ctx = _local_ctx(stage, peaks, REPRO_LIMIT_GB)
        cand = Candidate(candidate_id="c", stage=stage, overrides={N: 16}, expected_gain=0.2)
        verdict = RulesCritic().critique(ctx, [cand])
        [crit] = verdict.critiques
        if stage != "system" and peaks[8] > REPRO_LIMIT_GB:
            # stages 2 and 3 fix the system config: a base already over is no reason to refuse, but never "low"
            assert crit.accepted and crit.risk == "high", (peaks, crit)
        else:
            assert not crit.accepted, (peaks, crit)
        _never_low_over_the_limit(verdict, REPRO_LIMIT_GB)


# -- a batch -------------------------------------------------------------------------------------------------
def test_a_batch_never_holds_the_same_config_twice_nor_a_config_still_running():
    from tests.support.toy_backend import CKPT, MB, SEQS, SPACE

    base = SPACE.defaults()
    running = TrialRecord(trial_id="sys-02-x", stage="system", kind="candidate", config={**base, MB: 8})
    ctx = AgentContext(stage="system", objective="x", search_space=SPACE, base_config=base, best_overrides={},
                       profile=None, history=[], memory_limit_gb=3.0, predict_memory=lambda c: 1.0, num_candidates=6,
                       slots=3, pending=[running])
    # the best-scored ones are the running config and two copies of one config (same knobs, another order)
    cands = [Candidate(candidate_id="run", stage="system", overrides={MB: 8}, expected_gain=3.0),
             Candidate(candidate_id="a1", stage="system", overrides={SEQS: 16, CKPT: False}, expected_gain=2.0),
             Candidate(candidate_id="a2", stage="system", overrides={CKPT: False, SEQS: 16}, expected_gain=2.0),
             Candidate(candidate_id="b", stage="system", overrides={MB: 1}, expected_gain=0.5),
             Candidate(candidate_id="c", stage="system", overrides={SEQS: 4}, expected_gain=0.4)]
    verdict = RulesCritic().critique(ctx, cands)
    by_id = {c.candidate_id: c for c in cands}
    picks = verdict.picks
    configs = [config_hash({**base, **by_id[p].overrides}) for p in picks]
    assert len(picks) == 3, picks  # the slots are filled from what is left
    assert len(set(configs)) == len(configs), f"the same config twice in one batch: {picks}"
    assert config_hash(running.config) not in configs, f"a config still running is in the batch: {picks}"
    # and the batch rule alone, whatever the critic's ranking
    from mart.nodes.agents.batch import select_batch

    scored = [(c.candidate_id, 1.0, {**base, **c.overrides}) for c in cands]
    chosen = select_batch(scored, 4, anchors=[running.config])
    hashes = [config_hash(dict(s[2])) for s in scored if s[0] in chosen]
    assert "run" not in chosen and len(set(hashes)) == len(hashes) == len(chosen) == 3, chosen


# -- the early-look cut --------------------------------------------------------------------------------------
def _records(throughput: float, peak_gb: float, steps: int) -> list[StepRecord]:
    return [StepRecord(step=s, data={THROUGHPUT_KEY: throughput, "perf/max_memory_allocated_gb": peak_gb,
                                      "timing_s/step": 1.0}) for s in range(1, steps + 1)]


def test_the_early_look_cut_never_measures_a_trial_against_one_over_the_memory_margin(tmp_path: Path):
    limit = 72.0
    ledger = Ledger(tmp_path / "ledger.db")
    # finished: a fast trial that went over the margin (infeasible), running: a fast one over the margin too,
    # and the trial being judged, within the margin and far slower than both
    over_done = TrialRecord(trial_id="sys-02-over", stage="system", kind="candidate", config={"x": 2},
                            status="completed", throughput=900.0, peak_memory_gb=90.0, steps_done=6,
                            reason="peak memory above the margin")
    over_running = TrialRecord(trial_id="sys-03-over", stage="system", kind="candidate", config={"x": 3})
    judged = TrialRecord(trial_id="sys-04-slow", stage="system", kind="candidate", config={"x": 4})
    for seq, rec in enumerate((over_done, over_running, judged), 2):
        ledger.upsert_trial(rec, run_id="r", seq=seq, overrides={})
    ledger.add_metrics(over_done.trial_id, _records(900.0, 90.0, 6))
    ledger.add_metrics(over_running.trial_id, _records(800.0, 80.0, 3))
    ledger.add_metrics(judged.trial_id, _records(300.0, 40.0, 3))

    def running(rec: TrialRecord, slot: int) -> dict:
        return RunningTrial(record=rec, handle=TrialHandle(trial_id=rec.trial_id, backend="toy", trial_dir="."),
                            slot=slot, look_at=EARLY_LOOK_STEP, looked=True).model_dump(mode="json")

    options = SimpleNamespace(system_trials=6, system_horizon=6, wall_clock_s=None, start_overrides=None)
    services = SimpleNamespace(ledger=ledger, options=options, trial_slots=lambda: 3, job_description=lambda: object(),
                               memory_limit_gb=lambda: limit)
    state = {"running": {r.trial_id: running(r, i) for i, r in enumerate((over_running, judged))},
             "baseline": {}, "best": {}, "best_overrides": {}, "profiles": {}, "trial_seq": 4}
    view = StageView(state, services)
    assert SystemStage().cuts(view) == {}, "a trial was cut for one that is over the margin"
    # the rule does cut it against a trial within the margin (the test's setup can cut at all)
    fine = TrialRecord(trial_id="sys-05-fine", stage="system", kind="candidate", config={"x": 5},
                       status="completed", throughput=700.0, peak_memory_gb=50.0, steps_done=6)
    ledger.upsert_trial(fine, run_id="r", seq=5, overrides={})
    ledger.add_metrics(fine.trial_id, _records(700.0, 50.0, 6))
    cut = SystemStage().cuts(StageView(state, services))
    assert list(cut) == [judged.trial_id] and cut[judged.trial_id].startswith(CUT_REASON)
    assert "sys-05-fine" in cut[judged.trial_id]
    ledger.close()
