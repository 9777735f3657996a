"""Stage 3 keeps its schedules in memory as responses grow: every continuation the stage launches (the unchanged
ones and the re-evaluations, which no proposer sees) is re-projected at its own boundary from the path's measured
peaks, and runs with halved micro batches when the projection passes the limit; a segment that ran out of memory
anyway is re-run once from the same checkpoint with halved micro batches, and its re-run takes its place in the
tree. Through the schedule stage's policy on a real ledger (issue 44: Qwen3-0.6B's unchanged continuation ran out
of memory at step 51 after a step-15 projection said 56.6 GB, and nothing re-projected or re-ran it)."""

from __future__ import annotations

from types import SimpleNamespace

from mart.nodes.stages import StageView
from mart.nodes.stages.schedule import STAGE, ScheduleStage, tree_nodes
from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord
from mart.state.models import TrialRecord, TrialStatus
from mart.state.schedule import pick_schedule_winner, static_path
from mart.trial_runner.verl.space import SEARCH_SPACE as VERL

A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
MICRO = (R + "log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
         A + "ppo_micro_batch_size_per_gpu")
BASE = {**VERL.defaults(), R + "n": 8, A + "ppo_mini_batch_size": 64, "data.train_batch_size": 256,
        **{k: 16 for k in MICRO}}
LIMIT = 60.0  # GB


class _Backend:
    score_metric_prefix = "val-core/"

    @staticmethod
    def search_space():
        return VERL


def _setup(tmp_path, *, budget: int = 6, limit: float | None = LIMIT):
    tmp_path.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(tmp_path / "ledger.db")
    options = SimpleNamespace(seed=0, wall_clock_s=None, schedule_branches=3, schedule_boundaries=lambda: [4, 8],
                              schedule_trial_budget=lambda: budget, schedule_total_steps=lambda: 8)
    services = SimpleNamespace(ledger=ledger, backend=_Backend(), options=options, memory_limit_gb=lambda: limit)
    return ledger, services


def _add(ledger: Ledger, seq: int, record: TrialRecord, *, to: int, score: float | None = 0.5,
         status: TrialStatus = TrialStatus.COMPLETED, memory=None, changes: dict | None = None) -> None:
    done = record.model_copy(update={"status": status, "score": score if status == TrialStatus.COMPLETED else None,
                                     "steps_done": to})
    parent_cfg = {} if record.parent_trial is None else (ledger.trial(record.parent_trial) or {}).get("config") or {}
    over = changes if changes is not None else {k: v for k, v in record.config.items() if parent_cfg.get(k) != v}
    ledger.upsert_trial(done, run_id="r", seq=seq, horizon=to, overrides=over if record.parent_trial else {},
                        trial_dir=f"/runs/r/{record.trial_id}",
                        reason="CUDA out of memory in old_log_prob" if status == TrialStatus.OOM else None)
    if memory is not None:
        first = (record.parent_step or 0) + 1
        ledger.add_metrics(record.trial_id, [StepRecord(step=s, data={"perf/max_memory_allocated_gb": memory(s)})
                                             for s in range(first, to + 1)])


def _state(seq: int, expanded: list[str] | None = None) -> dict:
    root = TrialRecord(trial_id="root", stage=STAGE, kind="baseline", config=dict(BASE))
    return {"baseline": {STAGE: root}, "profiles": {STAGE: {}}, "trial_seq": seq,
            "schedule": {"expanding": None, "expanded": list(expanded or []), "notes": []},
            "selection": {"learning": {"noise": 0.01}}}


def _root(ledger: Ledger, memory) -> None:
    _add(ledger, 1, TrialRecord(trial_id="root", stage=STAGE, kind="baseline", config=dict(BASE)), to=4, memory=memory)


def test_an_unchanged_continuation_projected_past_the_limit_runs_with_halved_micro_batches(tmp_path):
    # the peak grows 2 GB a step: 46 GB now (the last 3 steps' mean), 54 GB projected at step 8
    ledger, services = _setup(tmp_path, limit=50.0)
    _root(ledger, lambda s: 40 + 2 * s)
    plan = ScheduleStage().plan(StageView(_state(1), services), 1)
    (cont,) = plan.launch
    assert cont.parent_trial == "root" and cont.trial_id.endswith("-static")
    assert all(cont.config[k] == 8 for k in MICRO)  # 16 -> 8: the same learning, less memory
    assert {k: v for k, v in cont.config.items() if k not in MICRO} == {k: v for k, v in BASE.items() if k not in MICRO}
    assert any("projected 54.0 GB at step 8" in n for n in plan.update["schedule"]["notes"])
    # it is still the unchanged continuation: the static path runs through it
    _add(ledger, 2, cont, to=8)
    nodes, _ = tree_nodes(services, prior_noise=0.01)
    node = next(n for n in nodes if n["id"] == cont.trial_id)
    assert node["changes"] == {} and node["memory_moves"] == {k: 8 for k in MICRO}
    assert [n["id"] for n in static_path(nodes)] == ["root", cont.trial_id]
    ledger.close()
    # a projection under the limit, or no limit at all: the parent's config as it is
    for i, limit in enumerate((60.0, None)):
        ledger, services = _setup(tmp_path / str(i), limit=limit)
        _root(ledger, lambda s: 40 + 2 * s)
        (cont,) = ScheduleStage().plan(StageView(_state(1), services), 1).launch
        assert cont.config == BASE
        ledger.close()


def test_a_segment_that_ran_out_of_memory_is_re_run_once_with_halved_micro_batches(tmp_path):
    ledger, services = _setup(tmp_path)
    _root(ledger, lambda s: 40.0)  # flat: the projection saw nothing coming
    ss = TrialRecord(trial_id="sch-02-static", stage=STAGE, kind="candidate", config=dict(BASE), parent_trial="root",
                     parent_step=4)
    _add(ledger, 2, ss, to=8, status=TrialStatus.OOM)
    plan = ScheduleStage().plan(StageView(_state(2, ["root"]), services), 1)
    (retry,) = plan.launch
    assert retry.trial_id == "sch-03-mem" and retry.parent_trial == "root" and retry.parent_step == 4
    assert retry.confirms is None and all(retry.config[k] == 8 for k in MICRO)
    assert any("sch-02-static ran out of memory" in n for n in plan.update["schedule"]["notes"])
    # the re-run takes the OOM'd segment's place: the static path completes through it
    _add(ledger, 3, retry, to=8, score=0.5)
    nodes, noise = tree_nodes(services, prior_noise=0.01)
    assert next(n for n in nodes if n["id"] == "sch-02-static").get("superseded")
    assert [n["id"] for n in static_path(nodes)] == ["root", "sch-03-mem"]
    winner, _ = pick_schedule_winner(nodes, 2, noise)
    assert winner is not None and winner.key == "sch-03-mem" and winner.is_baseline
    ledger.close()


def test_a_re_run_that_runs_out_of_memory_again_is_not_re_run(tmp_path):
    ledger, services = _setup(tmp_path)
    _root(ledger, lambda s: 40.0)
    ss = TrialRecord(trial_id="sch-02-static", stage=STAGE, kind="candidate", config=dict(BASE), parent_trial="root",
                     parent_step=4)
    _add(ledger, 2, ss, to=8, status=TrialStatus.OOM)
    again = ss.model_copy(update={"trial_id": "sch-03-mem", "config": {**BASE, **{k: 8 for k in MICRO}}})
    _add(ledger, 3, again, to=8, status=TrialStatus.OOM)
    plan = ScheduleStage().plan(StageView(_state(3, ["root"]), services), 1)
    assert not any(r.trial_id.endswith("-mem") for r in plan.launch)
    ledger.close()


def test_an_oom_re_evaluation_is_re_run_on_its_seed_and_counts_as_the_leaf_s_second_run(tmp_path):
    ledger, services = _setup(tmp_path, budget=6)
    _root(ledger, lambda s: 40.0)
    ss = TrialRecord(trial_id="ss", stage=STAGE, kind="candidate", config=dict(BASE), parent_trial="root", parent_step=4)
    _add(ledger, 2, ss, to=8, score=0.50, memory=lambda s: 40.0)
    a = TrialRecord(trial_id="a", stage=STAGE, kind="candidate", config={**BASE, A + "optim.lr": 2e-6},
                    parent_trial="root", parent_step=4)
    _add(ledger, 3, a, to=8, score=0.56, memory=lambda s: 40.0)
    rerun = TrialRecord(trial_id="a-s2", stage=STAGE, kind="confirm", config=dict(a.config), parent_trial="root",
                        parent_step=4, seed=1, confirms="a")
    _add(ledger, 4, rerun, to=8, status=TrialStatus.OOM)
    plan = ScheduleStage().plan(StageView(_state(4, ["root"]), services), 1)
    (retry,) = plan.launch
    assert retry.trial_id == "a-s2-mem" and retry.kind == "confirm" and retry.confirms == "a" and retry.seed == 1
    assert all(retry.config[k] == 8 for k in MICRO) and retry.config[A + "optim.lr"] == 2e-6
    _add(ledger, 5, retry, to=8, score=0.555)
    nodes, noise = tree_nodes(services, prior_noise=0.01)
    winner, ranked = pick_schedule_winner(nodes, 2, noise)
    leaf = next(c for c in ranked if c.key == "a")
    assert leaf.scores == [0.56, 0.555] and not leaf.signals  # the OOM'd run no longer counts against it
    assert winner.key == "a"
    ledger.close()
