"""Stage 1, ``system``: short trials of system knobs for throughput, within the GPU-memory margin.

The baseline runs alone and is profiled; then each decision fills the free slots with candidates (one
review), until the budget is spent or the agents find nothing new. The winner is the fastest trial that stayed
within the margin (``mart.state.objectives.system_outcome``); when none did, later stages are skipped: they
would only re-run an infeasible config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mart.nodes.stages._base import Outcome, Plan, StagePolicy, StageView, finite
from mart.state.agents import group_by_agent
from mart.state.metrics import THROUGHPUT_KEY, StepRecord, mean_over_steps
from mart.state.models import TrialRecord
from mart.state.objectives import peak_memory_gb, system_outcome, throughput_window
from mart.state.stages import SYSTEM_TRAITS
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


def _clean(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 6)


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

    def _looks_early(self, view: StageView) -> bool:
        return view.services.trial_slots() > 1 and view.services.job_description() is not None \
            and self.horizon(view.options) > EARLY_LOOK_STEP

    def look_at(self, view: StageView, record: TrialRecord) -> int | None:
        """With several slots (and a job model), every trial is looked at after ``EARLY_LOOK_STEP``."""
        return EARLY_LOOK_STEP if self._looks_early(view) else None

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
            own = mean_over_steps(mine, THROUGHPUT_KEY, first, last)
            if math.isnan(own):
                continue
            best = max(((mean_over_steps(recs, THROUGHPUT_KEY, first, last), other) for other, recs in refs.items()
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
        plan = candidate_plan(view, self.name, self.budget(view.options), free, kinds=("baseline", "candidate"))
        if plan.done and self._rerun_cut_baseline(view):
            return Plan(launch=[self.baseline_retry_record(view)])
        return plan

    def _rerun_cut_baseline(self, view: StageView) -> bool:
        """The baseline was cut for a faster trial, and in the end no trial stayed feasible (the faster ones grew
        past the margin or failed later): the defaults run once more, to their end, so the stage still has them."""
        state = view.state
        return (base_cut((state.get("baseline") or {}).get(self.name)) and not (state.get("best") or {}).get(self.name)
                and not view.in_flight(self.name) and view.launched(self.name, kinds=("baseline",)) == 1)

    def conclude(self, view: StageView, note: str | None) -> tuple[dict[str, Any], str | None]:
        self.record_result(view, note)
        state = view.state
        if (state.get("baseline") or {}).get("system") is not None and not (state.get("best") or {}).get("system"):
            return {}, "skipped: stage 1 found no feasible system config (see the system notes)"
        return {}, None

    def summary(self, state: Mapping[str, Any], services: Any) -> tuple[dict[str, Any], list[str]]:
        base, best = (state.get("baseline") or {}).get("system"), (state.get("best") or {}).get("system")
        overrides = (state.get("best_overrides") or {}).get("system", {})
        b_thr = base.throughput if base else None
        t_thr = best.throughput if best else None
        kept = base is not None and best is not None and best.trial_id == base.trial_id
        gain = 0.0 if kept and t_thr else (t_thr / b_thr - 1) * 100 if b_thr and t_thr else None
        steps = window = list(throughput_window(self.horizon(services.options)))
        cut = base_cut(base)
        if cut and base is not None and best is not None:
            # cut at its look: the baseline and the best compared over the steps the baseline ran (both carry the
            # same warm-up there; the best's whole-window figure against the baseline's early one would not)
            steps = [EARLY_LOOK_STEP, max(EARLY_LOOK_STEP, base.steps_done)]
            b_thr = _clean(mean_over_steps(services.ledger.metric_records(base.trial_id), THROUGHPUT_KEY, *steps))
            same = _clean(mean_over_steps(services.ledger.metric_records(best.trial_id), THROUGHPUT_KEY, *steps))
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
                           "best": _clean(same), "gain_pct": _clean(gain)},
            "kept_baseline": kept,
            "best_config": overrides,
            "best_config_by_agent": config_by_agent(overrides),
            "memory_limit_gb": _clean(services.memory_limit_gb()),
            "best_peak_memory_gb": _clean(best.peak_memory_gb if best else None),
        }
        cut_note = None
        if cut and base is not None:
            cut_note = (f"system stage: the baseline was {base.reason}; its throughput"
                        + (f" and the gain are measured over {fmt_steps(*steps)}, the best config's too"
                           if b_thr is not None else " is not reported: no config stayed feasible to compare it with"))
        notes = baseline_notes("system", base, best, (state.get("exhausted") or {}).get("system"), services,
                               cut_note=cut_note)
        return {"system": part}, notes
