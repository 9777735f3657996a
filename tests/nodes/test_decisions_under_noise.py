"""Stage 1 decides under noise (issue 43): the winner is re-measured interleaved with the baseline and taken only
when the interval of its gain from those fresh measurements excludes zero; a measurement in which a phase the
changed knobs do not act on moved beyond its noise is disturbed, not believed, and repeated once."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from mart.graph.figures import stage_figures
from mart.nodes.stages import StageView
from mart.nodes.stages.system import DISTURBED, MIN_ROUNDS, OVER_MARGIN, SystemStage, remeasure_rounds
from mart.state.evidence import disturbed_phases, phase_noise, remeasured_gain
from mart.state.ledger import Ledger
from mart.state.metrics import StepRecord
from mart.state.models import TrialRecord
from mart.state.stats import Interval
from mart.trial_runner.verl.space import SEARCH_SPACE

MNS = "actor_rollout_ref.rollout.max_num_seqs"  # acts on generation only
BASE = {MNS: 256}
FAST = {MNS: 512}


def _records(thr: list[float], gen: float = 10.0, update: float = 10.0, jitter: float = 0.01) -> list[StepRecord]:
    """Six steps; steps 3-5 carry ``thr``; phase times with a small step-to-step jitter."""
    out = []
    for step in range(1, 7):
        j = 1 + jitter * ((step % 3) - 1)
        t = thr[min(max(step - 3, 0), len(thr) - 1)]
        out.append(StepRecord(step=step, data={"perf/throughput": t, "timing_s/gen": gen * j,
                                               "timing_s/update_actor": update * j, "timing_s/step": (gen + update) * j}))
    return out


class _Session:
    """A ledger and the services a stage policy reads, for a stage-1 session of ``trials`` trials."""

    def __init__(self, tmp_path, trials: int = 12, share: float = 0.25):
        self.ledger = Ledger(tmp_path / "ledger.db")
        self.options = SimpleNamespace(system_trials=trials, system_horizon=6, wall_clock_s=None, start_overrides=None,
                                       seed=0, system_remeasure_share=share)
        backend = SimpleNamespace(base_config=lambda: dict(BASE), search_space=lambda: SEARCH_SPACE)
        self.services = SimpleNamespace(ledger=self.ledger, options=self.options, backend=backend, progress=None,
                                        run_id="r", trial_slots=lambda: 1, job_description=lambda: None,
                                        memory_limit_gb=lambda: 72.0)
        self.seq = 0
        self.state: dict = {"best": {}, "best_overrides": {}, "baseline": {}, "profiles": {"system": {}},
                            "trial_seq": 0}

    def add(self, trial_id: str, kind: str, config: dict, records: list[StepRecord], confirms: str | None = None,
            status: str = "completed") -> TrialRecord:
        self.seq += 1
        thr = sum(r.get("perf/throughput") for r in records if 3 <= r.step <= 5) / 3
        rec = TrialRecord(trial_id=trial_id, stage="system", kind=kind, config=config, status=status,
                          throughput=thr if status == "completed" else None, peak_memory_gb=50.0, steps_done=6,
                          confirms=confirms)
        self.ledger.upsert_trial(rec, run_id="r", seq=self.seq, overrides={})
        self.ledger.add_metrics(trial_id, records)
        self.state["trial_seq"] = self.seq
        return rec

    def view(self) -> StageView:
        return StageView(self.state, self.services)

    def searched(self, base_thr: list[float], best_thr: list[float]) -> None:
        """The search is over: the baseline and one faster-looking candidate (its budget spent)."""
        base = self.add("sys-01-baseline", "baseline", dict(BASE), _records(base_thr))
        best = self.add("sys-02-a", "candidate", dict(FAST), _records(best_thr))
        for i in range(3, self.options.system_trials + 1):  # the rest of the budget, slower configs
            self.add(f"sys-{i:02d}-x", "candidate", {MNS: 100 + i}, _records([500.0, 510.0, 490.0]))
        self.state.update(baseline={"system": base.brief()}, best={"system": best.brief()},
                          best_overrides={"system": dict(FAST)})

    def run_plan(self, measure: dict[str, list[float]]) -> list[str]:
        """Launch what the stage plans, one slot at a time, each re-measurement measuring ``measure[role]``, until
        it is done; the ids launched."""
        launched = []
        for _ in range(10):
            plan = SystemStage().plan(self.view(), 1)
            if plan.done:
                return launched
            [rec] = plan.launch
            role = "baseline" if rec.trial_id.endswith("baseline") else "best"
            self.add(rec.trial_id, rec.kind, rec.config, _records(measure[role]), confirms=rec.confirms)
            launched.append(rec.trial_id)
        raise AssertionError("the stage never concluded")


def test_a_noisy_gain_whose_interval_covers_zero_keeps_the_baseline(tmp_path):
    s = _Session(tmp_path)
    # selected on one lucky measurement (+30%); re-measured, the two are the same within their noise
    s.searched([1000.0, 1010.0, 990.0], [1300.0, 1310.0, 1290.0])
    launched = s.run_plan({"baseline": [1000.0, 1040.0, 970.0], "best": [1010.0, 985.0, 1030.0]})
    # interleaved: the baseline first, then the best, for every round the share allows (2 of 12 + 4)
    assert remeasure_rounds(s.options) == 2
    assert [t.split("-", 2)[2] for t in launched] == ["remeasure1-baseline", "remeasure1-best",
                                                      "remeasure2-baseline", "remeasure2-best"]
    update = SystemStage().choice(s.view())
    sel = update["selection"]["system"]
    iv = Interval.from_json(sel["interval"])
    assert sel["decision"] == "kept" and iv.covers(0.0) and not iv.excludes_zero
    assert iv.method == "paired-re-t-log" and iv.n_baseline == iv.n_candidate == 6  # 2 rounds x steps 3-5
    assert "insufficient evidence" in sel["why"]
    assert update["best"]["system"].trial_id == "sys-01-baseline" and update["best_overrides"]["system"] == {}


def test_a_gain_is_taken_only_when_its_fresh_re_measurement_excludes_zero(tmp_path):
    s = _Session(tmp_path, share=0.5)  # a budget of 6 rounds
    s.searched([1000.0, 1010.0, 990.0], [1400.0, 1410.0, 1390.0])
    launched = s.run_plan({"baseline": [1000.0, 1020.0, 985.0], "best": [1200.0, 1215.0, 1190.0]})
    # the second round settled it (one round cannot show the trials' own noise): no third round is spent
    assert remeasure_rounds(s.options) == 6 and len(launched) == 2 * MIN_ROUNDS == 4
    update = SystemStage().choice(s.view())
    sel = update["selection"]["system"]
    iv = Interval.from_json(sel["interval"])
    assert sel["decision"] == "taken" and iv.confirms_gain
    # the interval is the re-measurement's (+~20%), not the selecting measurement's winner's-curse +40%
    assert 15 < iv.estimate < 25 and not iv.covers(40.0)
    assert "best" not in update  # the incumbent stands


def test_the_gain_interval_appears_in_the_summary_json_and_every_channel(tmp_path):
    s = _Session(tmp_path)
    s.searched([1000.0, 1010.0, 990.0], [1400.0, 1410.0, 1390.0])
    s.run_plan({"baseline": [1000.0, 1020.0, 985.0], "best": [1200.0, 1215.0, 1190.0]})
    s.state.update(SystemStage().choice(s.view()))
    part, notes = SystemStage().summary(s.state, s.services)
    sys_ = part["system"]
    assert set(sys_["gain_interval"]) == set(Interval.__dataclass_fields__)  # Interval.to_json()'s shape
    assert sys_["decision"] == "taken" and sys_["remeasure"]["rounds"] == 2 and sys_["remeasure"]["of"] == "sys-02-a"
    assert sys_["gpu_hours"]["remeasure"] > 0 and sys_["gpu_hours"]["total"] == pytest.approx(
        sum(v for k, v in sys_["gpu_hours"].items() if k != "total"), rel=1e-6)
    assert any("re-measurement: 2 round(s)" in n and "GPU-hours" in n for n in notes), notes
    summary = {"stages": ["system"], "system": sys_}
    [fig] = stage_figures(summary)
    iv = Interval.from_json(sys_["gain_interval"])
    # the terminal table, the report's headline and Slack's message all print this figure's interval
    assert fig.interval and iv.describe() in fig.interval and "6 vs 6 measurements" in fig.interval
    assert iv.describe() in fig.sentence()


def test_a_taken_gain_is_reported_as_its_re_measurement_not_as_the_selecting_measurement(tmp_path):
    s = _Session(tmp_path)
    s.searched([1000.0, 1010.0, 990.0], [1400.0, 1410.0, 1390.0])  # selected at +40%: the winner's curse
    s.run_plan({"baseline": [1000.0, 1020.0, 985.0], "best": [1200.0, 1215.0, 1190.0]})
    s.state.update(SystemStage().choice(s.view()))
    sys_ = SystemStage().summary(s.state, s.services)[0]["system"]
    iv = Interval.from_json(sys_["gain_interval"])
    cmp_ = sys_["comparison"]
    # the headline gain is the re-measurement's, inside its own interval, and the figures beside it add up
    assert sys_["decision"] == "taken" and cmp_["measured"] == "re-measured"
    assert iv.lo <= sys_["throughput_gain_pct"] <= iv.hi and 15 < sys_["throughput_gain_pct"] < 25
    assert cmp_["gain_pct"] == sys_["throughput_gain_pct"] == pytest.approx((cmp_["best"] / cmp_["baseline"] - 1) * 100)
    assert cmp_["baseline"] == pytest.approx(1001.67, abs=0.01) and cmp_["best"] == pytest.approx(1201.67, abs=0.01)
    assert sys_["selecting_gain_pct"] == pytest.approx(40.0, abs=0.5)  # kept beside it, named
    [fig] = stage_figures({"stages": ["system"], "system": sys_})
    assert fig.gain == f"{sys_['throughput_gain_pct']:+.1f}%" and "+40.0%" not in fig.sentence()
    assert "1,400 when selected" in fig.best
    from mart.graph.report_data import stage_verdict

    verdict = stage_verdict({"system": sys_}, "system")
    assert verdict.startswith(f"gain {cmp_['gain_pct']:+.1f}% = 1,202 / 1,002 - 1") and "read +40.0%" in verdict


def test_a_best_that_goes_over_the_margin_when_re_measured_hands_over_to_its_runner_up(tmp_path):
    # the best sat at the margin; on the first round's workload it went over: the next fastest clean config is
    # re-measured in its place (within the rounds left) and, holding up, becomes the stage's best
    s = _Session(tmp_path, share=0.5)
    s.searched([1000.0, 1010.0, 990.0], [1400.0, 1410.0, 1390.0])
    runner = {MNS: 384}
    s.add("sys-13-runner", "candidate", runner, _records([1300.0, 1310.0, 1290.0]))
    s.add("sys-14-over", "candidate", {MNS: 448}, _records([1350.0, 1360.0, 1340.0]))
    s.services.ledger.set_trial_fields("sys-14-over", reason=OVER_MARGIN)  # faster, but not within the margin
    first = SystemStage().plan(s.view(), 1).launch[0]
    s.add(first.trial_id, first.kind, first.config, _records([1000.0, 1020.0, 985.0]), confirms=first.confirms)
    best = SystemStage().plan(s.view(), 1).launch[0]
    assert best.confirms == "sys-02-a"
    s.add(best.trial_id, best.kind, best.config, _records([1200.0, 1215.0, 1190.0]), confirms=best.confirms)
    s.services.ledger.set_trial_fields(best.trial_id, reason=OVER_MARGIN)
    launched = s.run_plan({"baseline": [1000.0, 1020.0, 985.0], "best": [1150.0, 1160.0, 1140.0]})
    rm = SystemStage().remeasurement(s.view())
    assert rm.of == "sys-13-runner" and set(rm.dropped) == {"sys-02-a"} and rm.rounds == MIN_ROUNDS
    assert len(launched) == 2 * MIN_ROUNDS and all(
        s.services.ledger.trial(t)["confirms"] == ("sys-01-baseline" if t.endswith("baseline") else "sys-13-runner")
        for t in launched)
    update = SystemStage().choice(s.view())
    sel = update["selection"]["system"]
    assert sel["decision"] == "taken" and sel["of"] == "sys-13-runner" and "sys-02-a did not hold up" in sel["why"]
    assert update["best"]["system"].trial_id == "sys-13-runner" and update["best_overrides"]["system"] == runner
    assert 12 < Interval.from_json(sel["interval"]).estimate < 18  # the runner-up's own rounds, not the best's


def test_a_disturbed_measurement_is_not_believed_and_is_repeated_once(tmp_path):
    s = _Session(tmp_path)
    base = s.add("sys-01-baseline", "baseline", dict(BASE), _records([1000.0, 1010.0, 990.0]))
    s.state.update(baseline={"system": base.brief()}, best={"system": base.brief()}, best_overrides={"system": {}})
    for i in (2, 3):  # two clean candidates give the phases' noise
        s.add(f"sys-0{i}-x", "candidate", {MNS: 100 + i}, _records([900.0, 905.0, 895.0]))
    # max_num_seqs acts on generation; here the update phase ran 51% slower too (the machine, not the knob)
    odd = s.add("sys-04-a", "candidate", dict(FAST), _records([700.0, 705.0, 695.0], update=15.1))
    update = SystemStage().collected(s.view(), odd, True)
    assert update["best"]["system"].trial_id == "sys-01-baseline"  # not believed
    why = s.ledger.trial("sys-04-a")["reason"]
    assert why.startswith(DISTURBED) and "update_actor +51%" in why
    s.state.update(update)
    plan = SystemStage().plan(s.view(), 1)
    [rep] = plan.launch
    assert rep.trial_id == "sys-04-a-repeat" and rep.kind == "confirm" and rep.confirms == "sys-04-a"
    assert rep.config == dict(FAST) and rep.seed != 0
    # the repeat measures cleanly: it stands for the candidate
    clean = s.add(rep.trial_id, rep.kind, rep.config, _records([1300.0, 1305.0, 1295.0]), confirms=rep.confirms)
    after = SystemStage().collected(StageView({**s.state}, s.services), clean, True)
    assert after["best"]["system"].trial_id == "sys-04-a-repeat" and after["best_overrides"]["system"] == FAST
    # once repeated, never again
    s.state.update(after)
    assert all(r.trial_id != "sys-04-a-repeat" for r in SystemStage().plan(s.view(), 1).launch)


def test_a_phase_the_changed_knob_acts_on_may_move_as_far_as_it_likes():
    base = _records([1000.0] * 3)
    fast_gen = _records([1500.0] * 3, gen=4.0)  # generation 2.5x faster: what max_num_seqs acts on
    noise = phase_noise([base, fast_gen], 3, 5)
    assert disturbed_phases(base, fast_gen, SEARCH_SPACE[MNS].acts_on, noise, 3, 5) == []
    moved = disturbed_phases(base, fast_gen, ("update_actor",), noise, 3, 5)
    assert [m.phase for m in moved] == ["gen"]
    assert disturbed_phases(base, fast_gen, ("all",), noise, 3, 5) == []  # an unknown knob may move anything


def test_every_sim_phase_a_system_knob_moves_is_in_its_catalogue_record():
    """``ParamSpec.acts_on`` is the one record of the phases a knob acts on: on the simulator, changing a knob
    alone moves no phase outside it (else stage 1 would call that knob's own effect a disturbance)."""
    from mart.trial_runner.sim import model
    from mart.trial_runner.sim import system as S
    from mart.trial_runner.sim.scenarios import load_scenario

    keys = {"t_gen": "gen", "t_old": "old_log_prob", "t_ref": "ref", "t_update": "update_actor",
            "t_weights": "update_weights", "t_reward": "reward", "t_adv": "adv"}
    sc = load_scenario("qwen3-8b-1x8")
    base = model.base_config(sc)

    def phases(cfg):
        o = S.simulate_step(sc, S.knobs_from_config(cfg), model.window_workloads(sc, cfg, 6)[1])
        return {v: float(o[k]) for k, v in keys.items()}

    ref = phases(base)
    checked = 0
    for p in SEARCH_SPACE.params:
        if p.stage != "system" or "all" in p.acts_on:
            continue
        v = base.get(p.key, p.default)
        values = [not v] if p.kind == "bool" else [c for c in (p.choices or ()) if c != v][:2] if p.choices else \
            [min(p.high, v * 2)] if isinstance(v, (int, float)) and v else []
        for value in values:
            got = phases({**base, p.key: value})
            moved = {ph for ph in ref if ref[ph] > 0 and abs(got[ph] / ref[ph] - 1) > 0.005}
            assert moved <= set(p.acts_on), (p.key, value, moved - set(p.acts_on))
            checked += 1
    assert checked >= 15


def test_the_re_measurement_pairs_the_same_step_of_the_two_trials_of_a_round():
    # a drift that slows both trials of round 2 by 30% cancels in the per-pair ratios
    rounds = [({3: 1000.0, 4: 1010.0, 5: 990.0}, {3: 1100.0, 4: 1111.0, 5: 1089.0}),
              ({3: 700.0, 4: 707.0, 5: 693.0}, {3: 770.0, 4: 777.7, 5: 762.3})]
    iv = remeasured_gain(rounds)
    assert iv is not None and iv.method == "paired-re-t-log" and iv.estimate == pytest.approx(10.0, abs=0.01)
    assert iv.hi - iv.lo < 0.1 and math.isclose(iv.n_baseline, 6)
    assert remeasured_gain([({3: 1.0}, {4: 2.0})]) is None  # no step in common: no pair
    # rounds 10% apart although each is tight: the two trials of a round did not share their luck, and the interval
    # widens to cover both rounds' gains rather than pool their pairs as if they were one trial's
    apart = [rounds[0], ({3: 1000.0, 4: 1010.0, 5: 990.0}, {3: 1210.0, 4: 1222.1, 5: 1197.9})]
    wide = remeasured_gain(apart)
    assert wide is not None and wide.method == "paired-re-t-log" and wide.covers(10.0) and wide.covers(21.0)


def test_stage_2s_gain_interval_comes_from_its_verdicts_figures():
    from mart.nodes.stages.learning import _gain_interval
    from mart.state.objectives import Contender

    base = Contender(key="lea-01-baseline", scores=[0.50, 0.52], signals=[], is_baseline=True)
    change = Contender(key="lea-02-a", scores=[0.60, 0.61], signals=[])
    one = Contender(key="lea-03-b", scores=[0.58], signals=[])
    # both ran on two seeds: their own spread (Welch t on the scores)
    iv = Interval.from_json(_gain_interval([base, change, one], change, noise=0.01, dof=12))
    assert iv.method == "welch-t" and iv.estimate == pytest.approx(0.095) and (iv.n_baseline, iv.n_candidate) == (2, 2)
    # one run of a config: the pooled noise the verdict's standard error uses, t with its degrees of freedom
    iv = Interval.from_json(_gain_interval([base, one], one, noise=0.01, dof=12))
    from scipy import stats

    half = stats.t.ppf(0.95, 12) * 0.01 * math.sqrt(1 / 2 + 1)
    assert iv.method == "known-noise-t" and iv.hi - iv.lo == pytest.approx(2 * half)
    # a kept baseline: the interval of the change that led it (re-run ones first); none when nothing led it
    assert Interval.from_json(_gain_interval([base, change, one], base, 0.01, 12)).estimate == pytest.approx(0.095)
    low = Contender(key="lea-04-c", scores=[0.40], signals=[])
    assert _gain_interval([base, low], base, 0.01, 12) is None


def test_a_phase_name_from_a_trials_log_with_terminal_controls_is_never_read_as_a_phase():
    from mart.state.evidence import phase_times

    recs = [StepRecord(step=3, data={"timing_s/gen": 1.0, "timing_s/\x1b[2Jevil": 2.0, "timing_s/step": 3.0})]
    assert phase_times(recs, 3, 5) == {"gen": [1.0]}
