"""Issue 28's memory-margin and health promises, each held by a test that fails when the promise is broken:
the search keeps its safety gap under the limit for every proposal, an OOM counts as a miss of the predicted
peak, the job model works at the capacity the user gave; the monitor watches re-evaluations too, "harmful"
dates from when a pathology began, reward concentration needs a team, and a one-round debate never warns of
stale rounds."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from mart.nodes.agents.job_model import JobModel, Observation
from mart.nodes.agents.model_search import search
from mart.nodes.health_monitor import assess
from mart.nodes.health_rules import HealthConfig, evaluate
from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord
from mart.state.models import TrialRecord, TrialStatus
from mart.trial_runner.verl.space import SEARCH_SPACE
from tests.support.jobs import base_config, job

# --------------------------------------------------------------------------- memory margin

def test_every_proposal_of_the_search_keeps_the_safety_gap_under_the_limit():
    for capacity in (80.0, 48.0):
        model = JobModel(job(capacity), base_config()).fit([])
        limit = 0.9 * capacity
        found = search(model, SEARCH_SPACE, base_config(), limit, n_out=6,
                       check=lambda ov: SEARCH_SPACE.check_constraints({**base_config(), **ov}))
        assert found
        for s in found:  # the whole list, not only the top: a reviewer may approve any of them
            assert s.gap_gb > 0.0
            assert s.peak_gb + s.gap_gb <= limit + 1e-9, (capacity, s.peak_gb, s.gap_gb, s.overrides)


def test_an_oom_counts_as_a_miss_of_the_predicted_peak():
    model = JobModel(job(80.0), base_config())
    accurate = [Observation(config=base_config(), phases={}, peak_gb=60.0, predicted_peak_gb=60.2) for _ in range(4)]
    narrow = model.fit(accurate).base_gap_gb()
    # the last prediction said 60 GB and the trial ran out of memory: it reached at least the 80 GB card
    oom = Observation(config=base_config(), phases={}, peak_gb=None, oom=True, predicted_peak_gb=60.0)
    wide = model.fit(accurate[:3] + [oom]).base_gap_gb()
    assert wide > 3 * narrow
    assert wide >= 0.08 * 80.0 - 1e-9  # a 20 GB miss widens the gap to its cap


def test_the_job_model_prices_the_capacity_the_user_gave(tmp_path):
    from mart.nodes.runtime import Services
    from mart.state.options import TuneOptions
    from mart.state.run_store import RunStore

    # a backend that describes its job on an 80 GB card and reports 80 GB itself (as a GPU backend reads NVML)
    backend = SimpleNamespace(name="stub", describe_job=lambda: job(80.0), memory_capacity_gb=lambda: 80.0)
    opts = TuneOptions(backend="sim", memory_capacity_gb=40.0, quiet=True, report=False, runs_dir=str(tmp_path))
    services = Services(options=opts, store=RunStore.create(tmp_path), backend=backend, runner=None,
                        proposer=None, critic=None)
    described = services.job_description()
    assert described is not None and described.hardware.memory_gb == 40.0  # --memory-capacity-gb wins over the backend's
    assert abs(services.memory_limit_gb() - (1 - opts.memory_margin) * 40.0) < 1e-9
    # and the model built on it solves the memory share for 40 GB: its proposals fit that card's limit
    model = JobModel(described, base_config()).fit([])
    limit = services.memory_limit_gb()
    found = search(model, SEARCH_SPACE, base_config(), limit, check=lambda ov: SEARCH_SPACE.check_constraints({**base_config(), **ov}))
    assert found and all(s.peak_gb + s.gap_gb <= limit + 1e-9 for s in found)
    assert JobModel(job(80.0), base_config()).fit([]).predict(found[0].overrides).peak_gb > limit  # 80 GB's reading differs


# --------------------------------------------------------------------------- health

def _collapsing(n: int) -> list[StepRecord]:
    # entropy falls to ~0 after step 3 while the reward stalls: a collapse that persists
    return [StepRecord(step=s, data={"actor/entropy": 1.0 if s <= 3 else 0.001, "actor/grad_norm": 1.0,
                                     "actor/ppo_kl": 0.01, "actor/pg_loss": 0.1, "critic/score/mean": 0.3,
                                     "response_length/mean": 50.0}) for s in range(1, n + 1)]


def _services(tmp_path: Path, records: list[StepRecord], trial_id: str):
    ledger = Ledger(Path(tmp_path) / "mart.sqlite")
    ledger.add_metrics(trial_id, records)
    return SimpleNamespace(ledger=ledger, memory_limit_gb=lambda: None, progress=None)


def test_a_collapsing_re_evaluation_is_stopped_like_any_candidate(tmp_path):
    records = _collapsing(20)
    services = _services(tmp_path, records, "t-confirm")
    stopped = {}
    for kind in ("confirm", "candidate", "baseline"):
        rec = TrialRecord(trial_id="t-confirm", stage="learning", kind=kind, config={}, status=TrialStatus.RUNNING,
                          confirms="t-1" if kind == "confirm" else None)
        stopped[kind] = assess(services, rec)
    assert stopped["confirm"] is not None and "entropy" in stopped["confirm"]
    assert stopped["candidate"] == stopped["confirm"]
    assert stopped["baseline"] is None  # the reference is never stopped (its events are still recorded)


def _team(n: int, agents: int, extra: dict) -> list[StepRecord]:
    out = []
    for s in range(1, n + 1):
        data = {}
        for a in range(agents):
            data.update({f"agent{a}/actor/entropy": 1.0, f"agent{a}/actor/grad_norm": 1.0,
                         f"agent{a}/actor/ppo_kl": 0.01, f"agent{a}/actor/pg_loss": 0.1,
                         f"agent{a}/critic/score/mean": 0.3, f"agent{a}/response_length/mean": 50.0})
        data.update({k: f(s) for k, f in extra.items()})
        out.append(StepRecord(step=s, data=data))
    return out


def test_harmful_dates_from_when_the_pathology_began():
    cfg = HealthConfig(window=3, pathology_stop_steps=8)
    copy = {"agent1/copy_rate": lambda s: 0.5 if s <= 4 else 0.95, "agent0/copy_rate": lambda s: 0.2}
    # the team's reward kept rising after the copying began (to 0.8 at step 12), then fell back a little:
    # measured from the onset (step 5) it improved, so the copying is a finding, not a stop
    rising = {"critic/score/mean": lambda s: 0.3 + 0.05 * min(s, 12) - (0.02 if s > 12 else 0.0)}
    events = evaluate("learning", "t", _team(16, 2, {**copy, **rising}), cfg)
    copying = [e for e in events if e.rule == "agent_copying"]
    assert copying and all(e.severity == "warn" for e in copying)
    # the same copying while the team's reward stays below its best before the onset: harmful
    stalled = {"critic/score/mean": lambda s: 0.6 if s <= 4 else 0.55}
    events = evaluate("learning", "t", _team(16, 2, {**copy, **stalled}), cfg)
    assert {e.severity for e in events if e.rule == "agent_copying"} == {"stop"}


def test_reward_concentration_needs_a_team():
    cfg = HealthConfig(window=3)
    one = {"agent0/reward_share": lambda s: 1.0}  # a one-agent job holds all of its own reward
    assert [e for e in evaluate("learning", "t", _team(10, 1, one), cfg) if e.rule == "reward_concentration"] == []
    two = {"agent0/reward_share": lambda s: 0.97, "agent1/reward_share": lambda s: 0.03}
    assert [e.agent for e in evaluate("learning", "t", _team(10, 2, two), cfg)
            if e.rule == "reward_concentration"] == [0]


def test_a_one_round_debate_never_warns_of_stale_rounds_through_the_monitor(tmp_path):
    stale = {"workflow/answer_change_rate": lambda s: 0.0, "workflow/agreement": lambda s: 1.0}
    records = _team(40, 2, stale)
    services = _services(tmp_path, records, "t-debate")
    seen = {}
    for rounds in (1, 3):
        rec = TrialRecord(trial_id="t-debate", stage="learning", kind="candidate", status=TrialStatus.RUNNING,
                          config={"workflow.num_rounds": rounds})
        services.ledger.db["health_events"].delete_where()
        assess(services, rec)
        seen[rounds] = {e.rule for e in services.ledger.health_events("t-debate")}
    assert "stale_debate_rounds" not in seen[1]  # the job's own config says one round: no later round exists
    assert "stale_debate_rounds" in seen[3]
