"""Stage 1, ``system``: short trials of system knobs for throughput, within the GPU-memory margin.

The baseline runs alone and is profiled; then each decision fills the free slots with candidates (one
review), until the budget is spent or the agents find nothing new. The incumbent is the fastest trial that stayed
within the margin (``mart.state.objectives.system_outcome``); when none did, later stages are skipped: they
would only re-run an infeasible config. Before it is declared the winner, the incumbent and the baseline are
re-measured interleaved (``StageTraits.remeasures``, within ``--system-remeasure-share``), and it is taken only
when the interval of its gain from those fresh measurements excludes zero (``SystemStage.choice``). A candidate
whose phases its changed knobs do not act on moved beyond their noise is disturbed: not believed, repeated once.
See docs/runtime.md, "Stage 1's verdict under noise".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mart.nodes.knob_effects import knob_facts
from mart.nodes.progress import HealthNotice, emit
from mart.nodes.stages._base import Outcome, Plan, StagePolicy, StageView, finite
from mart.state.agents import group_by_agent
from mart.state.evidence import disturbed_phases, phase_noise, remeasured_gain, spread_pct, window_throughputs
from mart.state.metrics import StepRecord, mean_throughput
from mart.state.models import TrialRecord
from mart.state.objectives import peak_memory_gb, system_outcome, throughput_window
from mart.state.schedule import gpu_hours
from mart.state.stages import SYSTEM_TRAITS
from mart.state.stats import Interval
from mart.state.units import fmt_gb, fmt_steps

#: with several slots, the step of each trial after which the job model counts what it measured (the early look):
#: step 1 carries the warm-up, step 2 is the first that times each phase as it runs. A slot that frees while others
#: run is then filled knowing every config in flight, not only the ones that ended
EARLY_LOOK_STEP = 2

#: a looked trial whose throughput since its look is below this share of the best measured over the same steps
#: (by a trial that stayed within the margin: one that ended, or another looked trial) is stopped there: it cannot
#: be the stage's winner, and its slot goes to the next candidate at once. The baseline too: with several slots the
#: bets beside it are often far faster, and its remaining steps would only confirm that; its throughput and the
#: stage's gain are then measured over the steps it ran (``SystemStage.summary``). The job model keeps what it
#: measured (``agent_context``). On the simulator step 2's throughput is 0.88-1.04 of the same trial's steps-3-5
#: mean (median 0.94-0.96), and every trial carries that warm-up alike, so two trials' noise stays inside the cut
CUT_SHARE = 0.85
#: how the ledger's reason for such a stop starts
CUT_REASON = "cut at its early look"
#: the ledger's reason of a completed trial whose peak memory was above the margin (infeasible)
OVER_MARGIN = "peak memory above the margin"

#: the ledger's reason of a completed trial whose phases that its changes do not act on moved beyond their noise
DISTURBED = "disturbed"
#: a disturbed measurement is repeated once (another seed), at most this many times per stage, beside the budget
MAX_REPEATS = 2
REPEAT_SEED_OFFSET = 100
#: rounds a verdict needs before it may settle early (when the budget has them): a trial's own luck on a shared
#: machine (0-24% between two trials of one config on a busy 2-core box, beside 2-4% between steps) is not shared
#: by the two trials of a round, so only a second round's spread can show it (``rounds_gain_interval``)
MIN_ROUNDS = 2
#: re-measurement round r of the baseline and the best config runs on the session's seed + r (both on the same
#: seed: the same prompts, so the same workload; a re-run on the selection's own seed would replay it on the sim)
_REMEASURE = re.compile(r"-remeasure(\d+)-(baseline|best)$")
_REPEAT = "-repeat"


def remeasure_rounds(options: Any) -> int:
    """Rounds (a baseline trial and a best-config trial each) the re-measurement may take:
    ``system_remeasure_share`` is the most of the stage's trials, re-measurements included, that it takes
    (0.5: up to 6 trials beside 6; 0.25: 2 beside 6, 4 beside 12)."""
    share = float(getattr(options, "system_remeasure_share", 0.0) or 0.0)
    if share <= 0:
        return 0
    return math.floor(share / (1 - share) * options.system_trials + 1e-9) // 2


def remeasure_role(trial_id: str) -> tuple[int, str] | None:
    """(round, ``baseline``/``best``) of a re-measurement trial's id; None for any other trial."""
    m = _REMEASURE.search(trial_id)
    return (int(m.group(1)), m.group(2)) if m else None


def is_repeat(trial_id: str) -> bool:
    return trial_id.endswith(_REPEAT)


@dataclass
class Remeasurement:
    """What the interleaved re-measurement found so far (``SystemStage.remeasurement``)."""

    rounds: int = 0  # rounds with both trials completed and used
    launched: int = 0  # rounds started
    interval: Interval | None = None
    excluded: list[str] = field(default_factory=list)  # rounds not used, and why
    best_failed: str | None = None  # the best config did not hold up: how its re-measurement ended
    of: str | None = None  # the trial whose config is re-measured (the best; its runner-up when the best failed)
    dropped: dict[str, str] = field(default_factory=dict)  # configs that did not hold up before it, and why
    trials: list[str] = field(default_factory=list)
    baseline_mean: float | None = None
    best_mean: float | None = None

    def settled(self, min_rounds: int) -> bool:
        """Nothing more to learn: the best config failed, or a gain or a loss is confirmed by at least
        ``min_rounds`` rounds (one round's pairs cannot show the trials' own noise: ``MIN_ROUNDS``)."""
        return self.best_failed is not None or (self.rounds >= min_rounds and self.interval is not None
                                                and self.interval.excludes_zero)


def _clean(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 6)


def _not_held(row: dict[str, Any]) -> str | None:
    """How a best-config re-measurement failed to hold up (out of memory, failed, stopped, over the margin), or None."""
    if row.get("status") not in ("running", "completed"):
        return f"{row['trial_id']} ended {row.get('status')} ({row.get('reason') or 'no reason'})"
    if row.get("reason") == OVER_MARGIN:
        return f"{row['trial_id']}'s peak memory was above the margin"
    return None


def _fmt_gb(v: float | None) -> str:
    return fmt_gb(v)


def config_by_agent(overrides: dict[str, Any]) -> dict[str, Any] | None:
    """A multi-agent job's best config split into shared knobs and each agent's (``agents.<i>.*``); None when
    no knob belongs to an agent."""
    shared, per_agent = group_by_agent(overrides or {})
    if not per_agent:
        return None
    return {"shared": shared, "per_agent": {str(a): knobs for a, knobs in per_agent.items()}}


def candidate_plan(view: StageView, stage: str, budget: int, free: int, *, kinds: tuple[str, ...]) -> Plan:
    """Stages 1 and 2 alike: propose for the free slots while the budget (trials of ``kinds``) lasts and the
    agents still find something; done when neither holds."""
    if view.exhausted(stage) or view.out_of_time():
        return Plan(done=True)
    left = budget - view.launched(stage, kinds=kinds)
    if left <= 0:
        return Plan(done=True)
    if view.waiting(stage) and view.in_flight(stage):
        return Plan()  # nothing new to try until a running trial tells the agents more
    return Plan(propose=min(free, left)) if free > 0 else Plan()


def base_cut(base: Any) -> bool:
    """The stage-1 baseline was cut at its early look (several slots): beaten over the same steps, not failed."""
    return base is not None and base.status.value == "stopped" and (base.reason or "").startswith(CUT_REASON)


def baseline_notes(stage: str, base_rec: Any, best_rec: Any, exhausted: str | None, services: Any,
                   why: str | None = None, cut_note: str | None = None) -> list[str]:
    """What a stage's summary says about its baseline and outcome (stages 1 and 2 alike); ``why``: the numbers
    behind a kept baseline (stage 2's verdict); ``cut_note``: what stage 1 says of a baseline cut at its look."""
    objective = {"system": "throughput", "learning": "score"}[stage]
    notes = []
    if cut_note:
        notes.append(cut_note)
    elif base_rec is not None and base_rec.status.value != "completed":
        notes.append(f"{stage} stage: the baseline {base_rec.status.value} ({base_rec.reason or 'no reason'}); "
                     f"it has no {objective} and is never reported as one")
    elif base_rec is not None and base_rec.reason and base_rec.objective(stage) is None:
        notes.append(f"{stage} stage: the baseline is {base_rec.reason}")
    elif base_rec is not None and base_rec.reason == OVER_MARGIN:
        notes.append(f"system stage: the baseline's peak memory ({_fmt_gb(base_rec.peak_memory_gb)}) is above "
                     f"the margin limit ({_fmt_gb(services.memory_limit_gb())}): it is not a feasible config")
    if base_rec is not None and best_rec is None:
        notes.append(f"{stage} stage: no feasible config - every trial failed, ran out of memory, was stopped "
                     f"or exceeded the memory margin; nothing is recommended for this stage")
    elif base_rec is not None and best_rec is not None and best_rec.trial_id == base_rec.trial_id:
        notes.append(f"{stage} stage: no candidate beat the baseline; the baseline config is kept"
                     + (f": {why}" if why else ""))
    if exhausted:
        notes.append(f"{stage} stage ended early: {exhausted}")
    return notes


class SystemStage(StagePolicy):
    name = "system"
    traits = SYSTEM_TRAITS
    objective = ("maximise end-to-end throughput (mean perf/throughput, tokens/s, over updates 3-5) while the peak "
                 "memory stays within (1 - margin) x capacity")

    def budget(self, options: Any) -> int:
        return options.system_trials

    def horizon(self, options: Any) -> int:
        return options.system_horizon

    def max_reruns(self, options: Any) -> int:
        """The re-measurement's trials (two a round); a disturbed measurement's rare repeats are not counted."""
        return 2 * remeasure_rounds(options)

    def _looks_early(self, view: StageView) -> bool:
        return view.services.trial_slots() > 1 and view.services.job_description() is not None \
            and self.horizon(view.options) > EARLY_LOOK_STEP

    def look_at(self, view: StageView, record: TrialRecord) -> int | None:
        """With several slots (and a job model), every trial is looked at after ``EARLY_LOOK_STEP``; a re-run
        (``confirm``: a repeat or a re-measurement) runs to its end: it is evidence, not a bet."""
        return EARLY_LOOK_STEP if self._looks_early(view) and record.kind != "confirm" else None

    def bets_beside_baseline(self, view: StageView) -> bool:
        """With several slots, the job model's proposals start beside the baseline (it predicts from the job's
        description before any measurement, with its widest safety gap): a whole trial of idle slots saved.
        (Waiting for the baseline's early look instead was measured and lost where the priors are right: see
        docs/runtime.md, "Early look".)"""
        return view.services.trial_slots() > 1 and view.services.job_description() is not None

    def cuts(self, view: StageView) -> dict[str, str]:
        """The looked trials to stop now (trial id -> why): throughput since the look below ``CUT_SHARE`` of the
        best any trial within the margin measured over the same steps. The baseline is judged alike (measured with
        N=4: the slot it frees at its look starts an informed candidate a wave earlier; shipped scenarios' wall
        clock to 97% 0.44x -> 0.40x of N=1, see docs/runtime.md)."""
        if not self._looks_early(view):
            return {}
        ledger, limit = view.ledger, view.services.memory_limit_gb()
        running = view.running(self.name)
        first_baseline = view.launched(self.name, kinds=("baseline",)) == 1  # a re-run baseline runs to its end
        judged = [rt for rt in running if rt.looked and rt.look_at and not rt.stop_reason and not rt.finished
                  and (rt.record.kind != "baseline" or first_baseline)]
        if not judged:
            return {}

        def within(records: list[StepRecord]) -> bool:
            peak = peak_memory_gb(records)
            return limit is None or math.isnan(peak) or peak <= limit

        refs: dict[str, list[StepRecord]] = {}
        for row in view.rows(self.name):
            if row.get("status") == "completed" and not row.get("early_stopped") and (
                    limit is None or row.get("peak_memory_gb") is None or row["peak_memory_gb"] <= limit):
                refs[row["trial_id"]] = ledger.metric_records(row["trial_id"])
        for rt in running:
            if rt.looked:
                records = ledger.metric_records(rt.record.trial_id)
                if within(records):
                    refs[rt.record.trial_id] = records
        out = {}
        for rt in judged:
            tid = rt.record.trial_id
            mine = refs.get(tid) or ledger.metric_records(tid)
            first, last = rt.look_at or EARLY_LOOK_STEP, max((r.step for r in mine), default=0)
            own = mean_throughput(mine, first, last)
            if math.isnan(own):
                continue
            best = max(((mean_throughput(recs, first, last), other) for other, recs in refs.items()
                        if other != tid), key=lambda t: -1.0 if math.isnan(t[0]) else t[0], default=None)
            if best is not None and not math.isnan(best[0]) and own < CUT_SHARE * best[0]:
                out[tid] = (f"{CUT_REASON}: {own:.0f} tokens/s over {fmt_steps(first, last)}, below {CUT_SHARE:.0%} of "
                            f"{best[1]}'s {best[0]:.0f} over the same steps")
        return out

    def outcome(self, services: Any, records: list[StepRecord], horizon: int, *, completed: bool) -> Outcome:
        """Throughput over the stage's window and the peak memory; above the margin the trial is infeasible."""
        outcome = system_outcome(records, horizon, services.memory_limit_gb())
        return Outcome({"throughput": finite(outcome.throughput), "peak_memory_gb": finite(outcome.peak_memory_gb)},
                       feasible=outcome.feasible, infeasible_reason=OVER_MARGIN)

    def plan(self, view: StageView, free: int) -> Plan:
        cuts = self.cuts(view)
        if cuts:
            return Plan(stop=cuts)
        first = self.baseline_plan(view, free)
        if first is not None:
            return first
        repeat = self._repeat(view) if free > 0 and not view.out_of_time() else None
        if repeat is not None:
            return Plan(launch=[repeat])
        plan = candidate_plan(view, self.name, self.budget(view.options), free, kinds=("baseline", "candidate"))
        if plan.done and self._rerun_cut_baseline(view):
            return Plan(launch=[self.baseline_retry_record(view)])
        if plan.done and not view.out_of_time() and self.traits.remeasures:
            return self._remeasure_plan(view, free)
        return plan

    # -- evidence: a disturbed measurement is repeated; the winner is re-measured beside the baseline --------
    def _window(self, view: StageView) -> tuple[int, int]:
        return throughput_window(self.horizon(view.options))

    def acts_on(self, view: StageView, config: Mapping[str, Any]) -> set[str]:
        """The phases the knobs ``config`` changes against the stage's base act on (``ParamSpec.acts_on``); a key
        the catalogue does not know may move anything (``all``)."""
        space, base = view.services.backend.search_space(), self.base_config(view)
        out: set[str] = set()
        for k, v in config.items():
            if base.get(k, object()) != v:
                # a local or MARTI knob, a per-agent copy: the phases of the verl record it names
                out |= set(knob_facts(space[k]).acts_on) if k in space else {"all"}
        return out

    def disturbed(self, view: StageView, trial_id: str, config: Mapping[str, Any], reference: str) -> list[str]:
        """The phases of ``trial_id`` that its changes do not act on and that moved against ``reference`` (the
        baseline, or the same round's baseline re-measurement) beyond their noise, pooled over the stage's
        completed trials (``mart.state.evidence.disturbed_phases``), in words."""
        ledger, (first, last) = view.ledger, self._window(view)
        done = [r["trial_id"] for r in view.rows(self.name) if r.get("status") == "completed"]
        noise = phase_noise([ledger.metric_records(t) for t in {*done, trial_id, reference}], first, last)
        moves = disturbed_phases(ledger.metric_records(reference), ledger.metric_records(trial_id),
                                 self.acts_on(view, config), noise, first, last)
        return [m.describe() for m in moves]

    def collected(self, view: StageView, record: TrialRecord, eligible: bool) -> dict[str, Any]:
        """A completed candidate (or a disturbed one's repeat) whose phases that its changes do not act on moved
        beyond their noise is not believed: the ledger's reason says ``disturbed``, it may not become the best, and
        the stage repeats it once (``_repeat``). A re-measurement is weighed when the stage concludes."""
        if record.kind == "confirm" and not is_repeat(record.trial_id):
            return {}
        base = (view.state.get("baseline") or {}).get(self.name)
        if record.kind != "baseline" and eligible and base is not None and base.trial_id != record.trial_id:
            moved = self.disturbed(view, record.trial_id, record.config, base.trial_id)
            if moved:
                why = (f"{DISTURBED}: {'; '.join(moved)}, phases its changes do not act on (against "
                       f"{base.trial_id}): the machine, not the knobs; not believed")
                view.ledger.set_trial_fields(record.trial_id, reason=why)
                emit(view.services, HealthNotice(trial_id=record.trial_id, rule=DISTURBED, severity="warn",
                                                 message=why))
                sel = dict((view.state.get("selection") or {}).get(self.name) or {})
                sel["disturbed"] = {**(sel.get("disturbed") or {}), record.trial_id: why}
                return {**super().collected(view, record, False),
                        "selection": {**(view.state.get("selection") or {}), self.name: sel}}
        if record.kind == "confirm":  # a clean repeat stands for the candidate it repeats
            record = record.model_copy(update={"kind": "candidate"})
        return super().collected(view, record, eligible)

    def _repeat(self, view: StageView) -> TrialRecord | None:
        """A disturbed measurement's one repeat on another seed (at most ``MAX_REPEATS`` per stage)."""
        disturbed = ((view.state.get("selection") or {}).get(self.name) or {}).get("disturbed") or {}
        ids = {r["trial_id"] for r in view.rows(self.name)} | {q.trial_id for q in view.queued(self.name)}
        repeats = sum(is_repeat(t) for t in ids)
        for tid in disturbed:
            if is_repeat(tid) or f"{tid}{_REPEAT}" in ids or repeats >= MAX_REPEATS:
                continue
            row = view.ledger.trial(tid) or {}
            return TrialRecord(trial_id=f"{tid}{_REPEAT}", stage=self.name, kind="confirm", config=row.get("config") or {},
                               seed=view.options.seed + REPEAT_SEED_OFFSET + repeats, confirms=tid)
        return None

    def _remeasure_target(self, view: StageView) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The ledger rows of the baseline and the best config when there is a gain to re-measure: a best that
        is not the baseline, and a baseline that ran within the margin (or was cut at its look)."""
        state = view.state
        base, best = (state.get("baseline") or {}).get(self.name), (state.get("best") or {}).get(self.name)
        if base is None or best is None or best.trial_id == base.trial_id or remeasure_rounds(view.options) <= 0:
            return None
        if not (base_cut(base) or (base.status.value == "completed" and base.throughput is not None
                                   and base.reason != OVER_MARGIN)):
            return None
        rows = {r["trial_id"]: r for r in view.rows(self.name)}
        if base.trial_id not in rows or best.trial_id not in rows:
            return None
        failed = self._failed_remeasures(rows.values())
        target = rows[best.trial_id]
        if target["trial_id"] in failed:
            # the best did not hold up (it went over the margin or out of memory on another workload): the fastest
            # config that has not failed yet is re-measured in its place, within the rounds left
            target = self._runner_up(rows, failed, rows[base.trial_id]) or target
        return rows[base.trial_id], target

    @staticmethod
    def _failed_remeasures(rows: Any) -> dict[str, str]:
        """trial id -> why: the configs whose re-measurement did not hold up (the trial it confirms ended out of
        memory, failed, was stopped, or went over the margin)."""
        out: dict[str, str] = {}
        for r in rows:
            role = remeasure_role(r["trial_id"])
            if role is not None and role[1] == "best" and r.get("confirms") and (why := _not_held(r)):
                out[r["confirms"]] = why
        return out

    @staticmethod
    def _runner_up(rows: dict[str, dict[str, Any]], failed: dict[str, str], base: dict[str, Any]
                   ) -> dict[str, Any] | None:
        """The search's fastest clean measurement (completed, within the margin, not disturbed) faster than the
        baseline whose config has not failed a re-measurement."""
        failed_configs = [rows[t].get("config") for t in failed if t in rows]
        out = None
        for r in rows.values():
            if remeasure_role(r["trial_id"]) is not None or r["trial_id"] == base["trial_id"] or \
                    r.get("kind") not in ("candidate", "confirm") or r.get("status") != "completed" or \
                    r.get("reason") or not finite(r.get("throughput")) or r.get("config") in failed_configs or \
                    r.get("config") == base.get("config"):
                continue
            if (base.get("throughput") is None or r["throughput"] > base["throughput"]) and \
                    (out is None or r["throughput"] > out["throughput"]):
                out = r
        return out

    def _remeasure_record(self, view: StageView, rnd: int, role: str, row: dict[str, Any]) -> TrialRecord:
        return TrialRecord(trial_id=f"{self.name[:3]}-{view.next_seq():02d}-remeasure{rnd}-{role}", stage=self.name,
                           kind="confirm", config=row.get("config") or {}, seed=view.options.seed + rnd,
                           confirms=row["trial_id"])

    def _remeasure_plan(self, view: StageView, free: int) -> Plan:
        """After the search: the baseline and the best config re-measured in rounds, interleaved (the baseline
        first, then the best; side by side with two free slots), until the gain's interval excludes zero or
        ``remeasure_rounds`` are spent. Waits for the search's last trials first."""
        running, queued = view.running(self.name), view.queued(self.name)
        if any(remeasure_role(rt.record.trial_id) is None for rt in running) or \
                any(remeasure_role(q.trial_id) is None for q in queued):
            return Plan()
        target = self._remeasure_target(view)
        if target is None:
            return Plan(done=True) if not running and not queued else Plan()
        if running or queued or free <= 0:
            return Plan()
        base_row, best_row = target
        rm = self.remeasurement(view)
        launched = {remeasure_role(r["trial_id"]) for r in view.rows(self.name)} - {None}
        if rm.launched and (rm.launched, "best") not in launched:  # the round's second half
            return Plan(launch=[self._remeasure_record(view, rm.launched, "best", best_row)])
        most = remeasure_rounds(view.options)
        if rm.settled(min(MIN_ROUNDS, most)) or rm.launched >= most:
            return Plan(done=True)
        rnd = rm.launched + 1
        first = self._remeasure_record(view, rnd, "baseline", base_row)
        if free < 2:
            return Plan(launch=[first])
        second = self._remeasure_record(view, rnd, "best", best_row).model_copy(
            update={"trial_id": f"{self.name[:3]}-{view.next_seq() + 1:02d}-remeasure{rnd}-best"})
        return Plan(launch=[first, second])

    def remeasurement(self, view: StageView) -> Remeasurement:
        """The re-measurement's rounds so far: the paired interval of the rounds whose two trials completed
        (``mart.state.evidence.remeasured_gain``), the rounds left out (a baseline re-run that failed, a disturbed
        pair), and whether the best config failed to hold up (out of memory, over the margin, failed)."""
        out = Remeasurement()
        rounds: dict[int, dict[str, dict[str, Any]]] = {}
        rows = view.rows(self.name)
        for r in rows:
            role = remeasure_role(r["trial_id"])
            if role is not None:
                rounds.setdefault(role[0], {})[role[1]] = r
                out.trials.append(r["trial_id"])
        out.launched = max(rounds, default=0)
        target = self._remeasure_target(view)
        if target is not None:
            out.of = target[1]["trial_id"]
            out.dropped = {t: why for t, why in self._failed_remeasures(rows).items() if t != out.of}
            # the rounds of the config re-measured now (a round whose best trial has not started is the current one)
            rounds = {k: v for k, v in rounds.items()
                      if (v.get("best") or {}).get("confirms", out.of) == out.of}
        first, last = self._window(view)
        ledger, pairs = view.ledger, []
        b_all: list[float] = []
        c_all: list[float] = []
        for rnd in sorted(rounds):
            b, c = rounds[rnd].get("baseline"), rounds[rnd].get("best")
            if c is not None and (why := _not_held(c)):
                out.best_failed = why
            if b is None or c is None or b.get("status") != "completed" or c.get("status") != "completed" \
                    or out.best_failed:
                if b is not None and b.get("status") not in ("running", "completed", None):
                    out.excluded.append(f"round {rnd}: {b['trial_id']} ended {b.get('status')}")
                continue
            moved = self.disturbed(view, c["trial_id"], c.get("config") or {}, b["trial_id"])
            if moved:
                out.excluded.append(f"round {rnd}: {DISTURBED} ({'; '.join(moved)})")
                continue
            bs = window_throughputs(ledger.metric_records(b["trial_id"]), first, last)
            cs = window_throughputs(ledger.metric_records(c["trial_id"]), first, last)
            pairs.append((bs, cs))
            b_all += list(bs.values())
            c_all += list(cs.values())
        out.rounds = len(pairs)
        out.interval = remeasured_gain(pairs)
        out.baseline_mean = _clean(sum(b_all) / len(b_all)) if b_all else None
        out.best_mean = _clean(sum(c_all) / len(c_all)) if c_all else None
        return out

    def _rerun_cut_baseline(self, view: StageView) -> bool:
        """The baseline was cut for a faster trial, and in the end no trial stayed feasible (the faster ones grew
        past the margin or failed later): the defaults run once more, to their end, so the stage still has them."""
        state = view.state
        return (base_cut((state.get("baseline") or {}).get(self.name)) and not (state.get("best") or {}).get(self.name)
                and not view.in_flight(self.name) and view.launched(self.name, kinds=("baseline",)) == 1)

    def conclude(self, view: StageView, note: str | None) -> tuple[dict[str, Any], str | None]:
        """The verdict under noise (``choice``; skipped when the wall-clock budget is spent: the best single
        measurement stands, and the notes say so), then the stage's ledger row."""
        update = self.choice(view)
        view = StageView({**view.state, **update}, view.services)
        self.record_result(view, note)
        state = view.state
        if (state.get("baseline") or {}).get("system") is not None and not (state.get("best") or {}).get("system"):
            return update, "skipped: stage 1 found no feasible system config (see the system notes)"
        return update, None

    def choice(self, view: StageView) -> dict[str, Any]:
        """The stage's verdict: the best config is taken only when the interval of its gain over the baseline,
        from their interleaved re-measurement (not from the measurement that selected it: the winner's curse
        biases that one up), excludes zero; otherwise the baseline is kept ("insufficient evidence"). The
        decision, its interval and the rounds behind it go to ``selection["system"]``."""
        state = view.state
        base, best = (state.get("baseline") or {}).get(self.name), (state.get("best") or {}).get(self.name)
        sel = dict((state.get("selection") or {}).get(self.name) or {})
        if base is None or best is None:
            return {}
        rounds = remeasure_rounds(view.options)
        sel.update(remeasure_share=getattr(view.options, "system_remeasure_share", 0.0), max_rounds=rounds)
        update: dict[str, Any] = {}
        if best.trial_id == base.trial_id:
            sel.update(decision="kept", why=None)
        elif self._remeasure_target(view) is None:
            sel.update(decision="taken", why="not re-measured ("
                       + ("--system-remeasure-share leaves no round" if rounds <= 0 else
                          "the baseline has no throughput within the margin to compare with")
                       + "): the gain is one measurement of each")
        else:
            rm = self.remeasurement(view)
            iv = rm.interval
            of = rm.of or best.trial_id
            sel.update(of=of, rounds=rm.rounds, trials=rm.trials, excluded=rm.excluded,
                       interval=iv.to_json() if iv is not None else None,
                       remeasured={"baseline": rm.baseline_mean, "best": rm.best_mean}, dropped=rm.dropped)
            before = "".join(f"{t} did not hold up when re-measured ({why}); " for t, why in rm.dropped.items())
            if view.out_of_time() and rm.launched == 0:
                sel.update(decision="taken", why="not re-measured: the wall-clock budget was spent")
            elif rm.best_failed:
                sel.update(decision="kept", why=f"{before}{of} did not hold up when re-measured: {rm.best_failed}")
            elif iv is None or not iv.known:
                sel.update(decision="kept", why=f"{before}insufficient evidence: {of} could not be re-measured "
                           + ("(" + "; ".join(rm.excluded) + ")" if rm.excluded else "beside the baseline"))
            elif iv.confirms_gain:
                sel.update(decision="taken", why=f"{before}{of}'s gain re-measured interleaved with the "
                           f"baseline: {iv.describe()}, excludes zero")
                if of != best.trial_id:  # the runner-up holds up where the best did not: it is the stage's best now
                    row = view.ledger.trial(of) or {}
                    runner = TrialRecord.from_row(row)
                    update["best"] = {**(state.get("best") or {}), self.name: runner.brief()}
                    update["best_overrides"] = {**(state.get("best_overrides") or {}),
                                                self.name: self.overrides_of(view, runner)}
            else:
                sel.update(decision="kept", why=f"{before}insufficient evidence: {of}'s gain re-measured "
                           f"interleaved with the baseline is {iv.describe()}, "
                           + ("a loss" if iv.confirms_loss else "which does not exclude zero"))
            if sel["decision"] == "kept":
                kept = base
                if kept.throughput is None and rm.baseline_mean is not None:  # cut at its look: its re-measured figure
                    kept = kept.model_copy(update={"throughput": rm.baseline_mean})
                update["best"] = {**(state.get("best") or {}), self.name: kept}
                update["best_overrides"] = {**(state.get("best_overrides") or {}), self.name: {}}
        update["selection"] = {**(state.get("selection") or {}), self.name: sel}
        return update

    def summary(self, state: Mapping[str, Any], services: Any) -> tuple[dict[str, Any], list[str]]:
        base, best = (state.get("baseline") or {}).get("system"), (state.get("best") or {}).get("system")
        overrides = (state.get("best_overrides") or {}).get("system", {})
        b_thr = base.throughput if base else None
        t_thr = best.throughput if best else None
        kept = base is not None and best is not None and best.trial_id == base.trial_id
        gain = 0.0 if kept and t_thr else (t_thr / b_thr - 1) * 100 if b_thr and t_thr else None
        steps = window = list(throughput_window(self.horizon(services.options)))
        cut = base_cut(base)
        sel = (state.get("selection") or {}).get("system") or {}
        means = sel.get("remeasured") or {}
        remeasured = sel.get("decision") == "taken" and bool(means.get("baseline")) and bool(means.get("best"))
        selecting_gain = None
        same: float | None
        if remeasured:
            # a taken config's gain is its re-measurement's (the means of the interleaved rounds, the interval's
            # data): the measurement that selected it is biased up (the winner's curse) and is kept beside it
            selecting_gain = (t_thr / b_thr - 1) * 100 if b_thr and t_thr else None
            rb, rc = float(means["baseline"]), float(means["best"])
            b_thr, same, gain = rb, rc, (rc / rb - 1) * 100
        elif cut and base is not None and best is not None:
            # cut at its look: the baseline and the best compared over the steps the baseline ran (both carry the
            # same warm-up there; the best's whole-window figure against the baseline's early one would not)
            steps = [EARLY_LOOK_STEP, max(EARLY_LOOK_STEP, base.steps_done)]
            b_thr = _clean(mean_throughput(services.ledger.metric_records(base.trial_id), *steps))
            same = _clean(mean_throughput(services.ledger.metric_records(best.trial_id), *steps))
            gain = (same / b_thr - 1) * 100 if b_thr and same else None
        else:
            same = t_thr
        part = {
            "baseline_throughput": _clean(b_thr),
            "baseline_steps": steps if b_thr is not None else None,
            "baseline_cut": cut,
            "best_throughput": _clean(t_thr),
            "throughput_gain_pct": _clean(gain),
            "best_steps": window if t_thr is not None else None,  # the steps `best_throughput` is over
            # the two figures the gain compares, over one step window (a cut baseline's steps: the best's figure
            # there is not its whole-window `best_throughput`); every channel prints these beside the gain
            "comparison": {"steps": steps if b_thr is not None else None, "baseline": _clean(b_thr),
                           "best": _clean(same), "gain_pct": _clean(gain),
                           "measured": "re-measured" if remeasured else "selecting"},
            # the gain the selecting measurement read, where the re-measurement's replaced it (else None)
            "selecting_gain_pct": _clean(selecting_gain),
            "kept_baseline": kept,
            "best_config": overrides,
            "best_config_by_agent": config_by_agent(overrides),
            "memory_limit_gb": _clean(services.memory_limit_gb()),
            "best_peak_memory_gb": _clean(best.peak_memory_gb if best else None),
        }
        part.update(self._evidence(state, services, sel, base, best))
        cut_note = None
        if cut and base is not None and not remeasured:
            cut_note = (f"system stage: the baseline was {base.reason}; its throughput"
                        + (f" and the gain are measured over {fmt_steps(*steps)}, the best config's too"
                           if b_thr is not None else " is not reported: no config stayed feasible to compare it with"))
        notes = baseline_notes("system", base, best, (state.get("exhausted") or {}).get("system"), services,
                               why=sel.get("why") if kept else None, cut_note=cut_note)
        notes += self._evidence_notes(sel, part, kept)
        return {"system": part}, notes

    def _evidence(self, state: Mapping[str, Any], services: Any, sel: Mapping[str, Any], base: Any,
                  best: Any) -> dict[str, Any]:
        """The summary's figures of how sure stage 1 is: the gain's interval from the re-measurement (None when
        nothing was re-measured), the decision, each compared trial's own spread over its measured steps, the
        disturbed measurements, and the GPU-hours the search, the repeats and the re-measurement took."""
        ledger, (first, last) = services.ledger, throughput_window(self.horizon(services.options))

        def spread(rec: Any) -> float | None:
            if rec is None:
                return None
            return spread_pct(window_throughputs(ledger.metric_records(rec.trial_id), first, last).values())

        hours = {"search": 0.0, "repeats": 0.0, "remeasure": 0.0}
        for row in ledger.trials(self.name):
            h = gpu_hours(ledger.metric_records(row["trial_id"]), row.get("config") or {}) or 0.0
            key = "remeasure" if remeasure_role(row["trial_id"]) else "repeats" if is_repeat(row["trial_id"]) \
                else "search"
            hours[key] += h
        total = sum(hours.values())
        return {
            # the best config's gain over the baseline from their interleaved re-measurement (Interval.to_json());
            # with a kept baseline, the gain of the config that was not confirmed
            "gain_interval": sel.get("interval"),
            "decision": sel.get("decision"),
            "remeasure": {"rounds": sel.get("rounds", 0), "max_rounds": sel.get("max_rounds", 0),
                          "share": sel.get("remeasure_share"), "trials": list(sel.get("trials") or []),
                          "of": sel.get("of"),  # the trial whose config was re-measured against the baseline
                          "excluded": list(sel.get("excluded") or []),
                          "means": sel.get("remeasured")},
            "spread_pct": {"baseline": spread(base), "best": spread(best)},
            "disturbed": dict(sel.get("disturbed") or {}),
            "gpu_hours": {k: round(v, 6) for k, v in {**hours, "total": total}.items()},
        }

    @staticmethod
    def _evidence_notes(sel: Mapping[str, Any], part: Mapping[str, Any], kept: bool) -> list[str]:
        notes = []
        hours = part.get("gpu_hours") or {}
        if sel.get("decision") == "taken" and sel.get("why"):
            notes.append(f"system stage: {sel['why']}")
        if part["remeasure"]["trials"]:
            share = hours.get("remeasure", 0.0) / hours["total"] if hours.get("total") else None
            notes.append(f"system stage: re-measurement: {part['remeasure']['rounds']} round(s) of the baseline and "
                         f"the best config interleaved, {len(part['remeasure']['trials'])} trial(s)"
                         + (f", {share:.0%} of the stage's GPU-hours" if share is not None else "")
                         + f" (at most {part['remeasure']['max_rounds']} round(s): --system-remeasure-share "
                         f"{sel.get('remeasure_share')})"
                         + ("; left out: " + "; ".join(part["remeasure"]["excluded"]) if part["remeasure"]["excluded"]
                            else ""))
        for tid, why in (sel.get("disturbed") or {}).items():
            notes.append(f"system stage: {tid} was {why}" + ("; repeated once on another seed"
                                                              if not is_repeat(tid) else ""))
        return notes
