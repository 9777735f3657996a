"""Stage 2, ``learning``: longer trials of learning knobs for validation score, the system config fixed.

The baseline (stage 1's best system config) runs alone and is profiled; candidates fill the free slots while the
budget lasts. Then selection under noise: within ``learning_confirm_trials`` re-runs on another seed (kind
``confirm``; the defaults' re-run counts too), the highest single-run change that could still win is re-run,
and the defaults are re-run as soon as a re-run change leads them. Re-runs start as soon as slots free up, beside
candidates still running. A change replaces the defaults only with two seeds, a lead over them of more than 2
standard errors of the difference (3 when a collapse was seen within two doublings of its lr), no collapse signal,
and no collapse seen within one doubling of its lr; with weak evidence the smaller move from the defaults wins.
The pure parts: ``mart.state.objectives`` (pooled_noise, collapse_signals, learning_choice, next_reevaluation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mart.nodes.stages._base import Plan, StagePolicy, StageView
from mart.nodes.stages.system import _clean, baseline_notes, candidate_plan, config_by_agent
from mart.state.models import TrialRecord
from mart.state.objectives import (
    RISK_AT_CLIFF,
    RISK_BELOW_COLLAPSE,
    Contender,
    baseline_verdict,
    collapse_signals,
    learning_choice,
    move_size,
    next_reevaluation,
    noise_estimate,
    pooled_noise,
    replicate_noise,
    validation_series,
)
from mart.state.stages import LEARNING_TRAITS
from mart.state.stats import difference_interval, noise_difference_interval
from mart.state.verl_keys import LR_KEY

CONFIRM_SEED_OFFSET = 1  # the re-evaluation seed: the session's seed + 1
FALLBACK_NOISE_SHARE = 0.02  # noise = 2% of the baseline score when no trial has enough validation points
CLIFF_FACTOR = 2.0  # one doubling of the lr: the step the proposers take


def learning_lrs(row: dict[str, Any]) -> dict[str, float]:
    """The actor learning rate(s) of a trial's config: verl's key, or one per agent (``agents.<i>.<key>``)."""
    out = {}
    for k, v in (row.get("config") or {}).items():
        if k == LR_KEY or k.endswith("." + LR_KEY):
            try:
                out[k] = float(v)
            except (TypeError, ValueError):
                continue
    return out


class LearningStage(StagePolicy):
    name = "learning"
    traits = LEARNING_TRAITS
    objective = "maximise the final validation score with the system config fixed; unhealthy trials are stopped early"

    def budget(self, options: Any) -> int:
        return options.learning_trials

    def horizon(self, options: Any) -> int:
        return options.learning_horizon

    def max_reruns(self, options: Any) -> int:
        return int(getattr(options, "learning_confirm_trials", 0) or 0)

    def base_config(self, view: StageView) -> dict[str, Any]:
        """The backend's base and ``--set`` values, with stage 1's best system overrides fixed."""
        base = super().base_config(view)
        base.update((view.state.get("best_overrides") or {}).get("system", {}))
        return base

    # -- decisions --------------------------------------------------------------------------------
    def bets_beside_baseline(self, view: StageView) -> bool:
        """With several slots, candidates start beside the defaults' run: the rules' first moves are priors, and the
        defaults are a contender compared at the end like any other."""
        return view.services.trial_slots() > 1

    def plan(self, view: StageView, free: int) -> Plan:
        first = self.baseline_plan(view, free)
        if first is not None:
            return first
        candidates = candidate_plan(view, self.name, self.budget(view.options), free, kinds=("baseline", "candidate"))
        if not candidates.done or view.out_of_time():
            return candidates
        # the budget is spent (or nothing new to try): re-runs on a second seed, as slots free up
        if free <= 0:
            return Plan()
        records = self.reevaluations(view, free)
        if records:
            return Plan(launch=records)
        return Plan() if view.running(self.name) else Plan(done=True)

    def reevaluations(self, view: StageView, free: int) -> list[TrialRecord]:
        """Up to ``free`` re-runs to start now, decided from the finished trials alone (a re-run in flight counts
        as made), within ``learning_confirm_trials``."""
        contenders, noise, dof, rows = self.evidence(view)
        if not contenders:
            return []
        confirms = [r for r in rows.values() if r.get("kind") == "confirm"]
        queued = [r for r in view.queued(self.name) if r.kind == "confirm"]
        left = getattr(view.options, "learning_confirm_trials", 3) - len(confirms) - len(queued)
        rerun = {c for c in [*(r.get("confirms") for r in confirms), *(r.confirms for r in queued)] if c}
        out: list[TrialRecord] = []
        while left > 0 and len(out) < free:
            c = next_reevaluation(contenders, noise, rerun, dof=dof)
            if c is None:
                break
            rerun.add(c.key)
            left -= 1
            out.append(self._rerun(view, c.key, rows))
        base = next((c for c in contenders if c.is_baseline), None)
        if len(out) >= 2 and base is not None and base.key not in rerun and len(base.scores) == 1 and any(
                c.mean > base.mean for c in contenders if c.key in {r.confirms for r in out}):
            # one at a time, the defaults are re-run once a re-run change leads them; a batch cannot wait for that
            # result, so the defaults' re-run goes with it whenever a change re-run in it could lead them
            if left <= 0 or len(out) >= free:
                out.pop()  # the least promising change's re-run makes room
            out.append(self._rerun(view, base.key, rows))
        return out

    @staticmethod
    def _rerun(view: StageView, key: str, rows: dict[str, dict[str, Any]]) -> TrialRecord:
        # no candidate_id: the candidate was approved and ran once; `confirms` links the re-run to it
        return TrialRecord(trial_id=f"{key}-s{CONFIRM_SEED_OFFSET + 1}", stage="learning", kind="confirm",
                           config=rows[key]["config"], seed=view.options.seed + CONFIRM_SEED_OFFSET, confirms=key)

    def evidence(self, view: StageView) -> tuple[list[Contender], float, float | None, dict[str, dict[str, Any]]]:
        """Contenders (originals with their re-runs), the pooled noise and its degrees of freedom (None: a
        fallback guess), and the ledger rows by trial id. Trials still running are no evidence yet."""
        ledger = view.ledger
        prefix = view.services.backend.score_metric_prefix
        rows = {r["trial_id"]: r for r in ledger.trials("learning")}
        events: dict[str, list[str]] = {}
        for e in ledger.health_events():
            events.setdefault(e.trial_id, []).append(e.rule)
        used, estimates = _evidence_runs(ledger, rows, events, prefix)
        pooled = pooled_noise(estimates)
        runs = _runs_by_config(used, events, pooled[0] if pooled else None, prefix)
        # the seed-to-seed spread of configs re-run without a collapse signal measures the same noise directly
        for rs in runs.values():
            est = replicate_noise([s for s, _ in rs]) if all(not sig and not math.isnan(s) for s, sig in rs) else None
            if est is not None:
                estimates.append(est)
        pooled = pooled_noise(estimates) or pooled
        noise, dof = pooled if pooled else (None, None)
        baseline = (view.state.get("baseline") or {}).get("learning")
        if noise is None:
            noise = FALLBACK_NOISE_SHARE * abs(baseline.score or 0.0) if baseline is not None else 0.0
        collapsed = [(tid, learning_lrs(r)) for tid, r in rows.items()
                     if r.get("early_stopped") or r.get("status") in ("oom", "failed")]
        base_lrs = learning_lrs(rows.get(baseline.trial_id, {})) if baseline is not None else {}
        stage_base = self.base_config(view)
        contenders = [c for key, rs in runs.items()
                      if (c := _contender(key, rs, rows, stage_base)) is not None]
        for c in contenders:
            _collapse_risk(c, rows, collapsed, base_lrs)
        return contenders, noise, dof, rows

    def collected(self, view: StageView, record: TrialRecord, eligible: bool) -> dict[str, Any]:
        if record.kind == "confirm":  # a re-evaluation: weighed with the trial it repeats at the end
            return {}
        return super().collected(view, record, eligible)

    def conclude(self, view: StageView, note: str | None) -> tuple[dict[str, Any], str | None]:
        """The final choice under noise (skipped when the wall-clock budget is spent: the best single run
        stands), then the stage's ledger row."""
        update: dict[str, Any] = {} if view.out_of_time() else self.choice(view)
        merged = StageView({**view.state, **update}, view.services)
        self.record_result(merged, note)
        return update, None

    def choice(self, view: StageView) -> dict[str, Any]:
        """The state update naming the final learning winner (``selection``, and ``best`` when it changes)."""
        contenders, noise, dof, rows = self.evidence(view)
        if not contenders:
            return {}
        confirms = sorted((r for r in rows.values() if r.get("kind") == "confirm"), key=lambda r: r.get("seq") or 0)
        winner, why = learning_choice(contenders, noise, dof=dof)
        ranked = sorted(contenders, key=lambda c: -c.mean)
        selection = {
            "winner": winner.key, "mean": winner.mean, "spread": winner.spread, "runs": len(winner.scores),
            "noise": noise, "noise_dof": None if dof is None else round(dof, 1),
            "reevaluated": [r.get("confirms") for r in confirms],
            "confirm_budget": getattr(view.options, "learning_confirm_trials", 3), "why": why,
            # the numbers behind "no candidate beat the baseline": the lead, the bar, the rule
            "verdict": baseline_verdict(contenders, noise, dof=dof) if winner.is_baseline else None,
            "contenders": [{"trial_id": c.key, "mean": round(c.mean, 6), "runs": len(c.scores),
                            "spread": None if c.spread is None else round(c.spread, 6), "move": round(c.move, 3),
                            "signals": c.signals + ([c.risk_why] if c.risk_why else [])}
                           for c in ranked],
        }
        selection["interval"] = _gain_interval(contenders, winner, noise, dof)
        update: dict[str, Any] = {"selection": {**(view.state.get("selection") or {}), "learning": selection}}
        best = dict(view.state.get("best") or {})
        incumbent = best.get("learning")
        if incumbent is None or incumbent.trial_id != winner.key:
            row = rows[winner.key]
            best["learning"] = TrialRecord(
                trial_id=winner.key, stage="learning", kind=row.get("kind") or "candidate",
                candidate_id=row.get("candidate_id"), status=row.get("status"),
                score=row.get("score"), steps_done=row.get("steps_done") or 0)
            best_overrides = dict(view.state.get("best_overrides") or {})
            best_overrides["learning"] = {} if winner.is_baseline else (row.get("overrides") or {})
            update.update(best=best, best_overrides=best_overrides)
        return update

    def result_values(self, state: Mapping[str, Any]) -> tuple[float | None, float | None]:
        b_score, t_score, _ = self.figures(state)
        return b_score, t_score

    @staticmethod
    def figures(state: Mapping[str, Any]) -> tuple[float | None, float | None, bool]:
        """The stage's baseline and best scores as every channel shows them (terminal, ``--json``, report, Slack),
        computed here once: the mean over each config's runs (seeds) once the final choice is made, not its luckiest
        run; and whether the baseline was kept."""
        base, best = (state.get("baseline") or {}).get("learning"), (state.get("best") or {}).get("learning")
        sel = (state.get("selection") or {}).get("learning") or {}
        b_score = base.score if base else None
        t_score = best.score if best else None
        if sel and best is not None and sel.get("winner") == best.trial_id:
            t_score = sel["mean"]  # the mean over its runs (seeds), not its luckiest run
            base_row = next((c for c in sel.get("contenders", []) if base and c["trial_id"] == base.trial_id), None)
            b_score = base_row["mean"] if base_row else b_score
        kept = base is not None and best is not None and best.trial_id == base.trial_id
        if kept:
            t_score = b_score  # one figure: the baseline's, not a second rounding of it
        return _clean(b_score), _clean(t_score), kept

    # -- what people see --------------------------------------------------------------------------
    def summary(self, state: Mapping[str, Any], services: Any) -> tuple[dict[str, Any], list[str]]:
        base, best = (state.get("baseline") or {}).get("learning"), (state.get("best") or {}).get("learning")
        overrides = (state.get("best_overrides") or {}).get("learning", {})
        sel = (state.get("selection") or {}).get("learning") or {}
        b_score, t_score, kept = self.figures(state)
        part = {
            "baseline_score": b_score,
            "best_score": t_score,
            "score_gain": (0.0 if kept else _clean(t_score - b_score)) if t_score is not None and b_score is not None
            else None,
            "kept_baseline": kept,
            "best_config": overrides,
            "best_config_by_agent": config_by_agent(overrides),
            # selection under noise: the winner's score is a mean over `best_score_runs` seeds
            "best_score_spread": _clean(sel.get("spread")),
            "best_score_runs": sel.get("runs", 1 if best else 0),
            "score_noise": _clean(sel.get("noise")),
            "reevaluated": sel.get("reevaluated", []),
            "contenders": sel.get("contenders", []),
            # the verdict in numbers (lead, bar, standard error, rule), taken or kept: the report shows it
            "verdict": sel.get("verdict") or sel.get("why"),
            # the winner's score difference over the baseline with its interval (Interval.to_json()); with a kept
            # baseline, that of the change that led it; None when no change scored above it
            "gain_interval": sel.get("interval"),
        }
        notes = baseline_notes("learning", base, best, (state.get("exhausted") or {}).get("learning"), services,
                               why=sel.get("verdict"))
        return {"learning": part}, notes


def _gain_interval(contenders: list[Contender], winner: Contender, noise: float, dof: float | None
                   ) -> dict[str, Any] | None:
    """The score difference over the baseline of the winner (a kept baseline: of the change that led it, re-run
    ones first, as ``baseline_verdict`` names it) with its interval: from the two configs' own seed-to-seed spread
    (``difference_interval``, Welch) when both ran on two seeds or more, else from the pooled noise the verdict's
    standard error uses (``noise_difference_interval``). None without a measured baseline or a change above it."""
    base = next((c for c in contenders if c.is_baseline), None)
    if base is None:
        return None
    if winner is base:
        rivals = sorted((c for c in contenders if not c.is_baseline and c.mean > base.mean),
                        key=lambda c: (len(c.scores) < 2, -c.mean, c.key))
        if not rivals:
            return None
        winner = rivals[0]
    if len(base.scores) >= 2 and len(winner.scores) >= 2:
        iv = difference_interval(base.scores, winner.scores)
    else:
        iv = noise_difference_interval(base.scores, winner.scores, noise, dof=dof)
    return iv.to_json()


Run = tuple[str, dict[str, Any], bool, list]
"""A finished trial as evidence: its id, ledger row, whether it has a usable score, its metric records."""


def _evidence_runs(ledger: Any, rows: dict[str, dict[str, Any]], events: dict[str, list[str]], prefix: str
                   ) -> tuple[list[Run], list[tuple[float, int]]]:
    """The finished originals and re-runs that count as evidence, and the noise estimates of the healthy scored
    ones' validation series."""
    used: list[Run] = []
    estimates: list[tuple[float, int]] = []
    for tid, row in rows.items():
        key = row.get("confirms") or tid
        if key not in rows or rows[key].get("kind") not in ("baseline", "candidate") or row.get("status") == "running":
            continue
        usable = row.get("status") == "completed" and row.get("score") is not None
        if not usable and row.get("kind") != "confirm":
            continue  # an original that failed is no contender; a failed re-evaluation is evidence against it
        records = ledger.metric_records(tid)
        est = noise_estimate(validation_series(records, prefix))
        if est is not None and usable and not events.get(tid):
            estimates.append(est)
        used.append((tid, row, usable, records))
    return used, estimates


def _runs_by_config(used: list[Run], events: dict[str, list[str]], noise: float | None, prefix: str
                    ) -> dict[str, list[tuple[float, list[str]]]]:
    """Per config: the original run first, then its re-evaluations (score or NaN, collapse signals)."""
    runs: dict[str, list[tuple[float, list[str]]]] = {}
    for tid, row, usable, records in sorted(used, key=lambda u: (u[1].get("confirms") is not None, u[1].get("seq") or 0)):
        signals = collapse_signals(records, events.get(tid, []), noise, prefix) if usable else []
        if row.get("early_stopped") or not usable:
            signals.append(f"run {tid} ended {row.get('status')}" + (" early" if row.get("early_stopped") else ""))
        runs.setdefault(row.get("confirms") or tid, []).append((float(row["score"]) if usable else math.nan, signals))
    return runs


def _contender(key: str, rs: list[tuple[float, list[str]]], rows: dict[str, dict[str, Any]],
               stage_base: dict[str, Any]) -> Contender | None:
    """A config's runs as a contender, or None when its original run has no score."""
    scores = [s for s, _ in rs if not math.isnan(s)]
    if not scores or math.isnan(rs[0][0]):
        return None
    c = Contender(key=key, scores=scores, signals=[x for _, sig in rs for x in sig],
                  is_baseline=rows[key].get("kind") == "baseline")
    c.first_signals = list(rs[0][1])
    c.move = 0.0 if c.is_baseline else move_size(rows[key].get("overrides") or {}, stage_base)
    return c


def _collapse_risk(c: Contender, rows: dict[str, dict[str, Any]], collapsed: list[tuple[str, dict[str, float]]],
                   base_lrs: dict[str, float]) -> None:
    """The collapse hazard rises steeply with the learning rate (lr 50x too high collapses Qwen3-0.6B): one or
    two lucky seeds of a config near a collapse are no proof of safety. Against the lowest raised lr that
    collapsed (stopped by the health monitor, oom or failed) at or above its own: less than one doubling away =
    at the cliff edge (never replaces the defaults), less than two = below a collapse (needs a larger lead),
    further down = no risk inferred."""
    key = c.key
    # per lr knob it raised (one per agent in a multi-agent job): the nearest collapse at or above it
    near = sorted((clrs[k] / lr, k, tid) for k, lr in learning_lrs(rows[key]).items()
                  if k in base_lrs and lr > base_lrs[k]
                  for tid, clrs in collapsed if tid != key and clrs.get(k, 0.0) >= lr)
    if near and near[0][0] < CLIFF_FACTOR ** 2:
        ratio, k, tid = near[0]
        c.risk = RISK_AT_CLIFF if ratio < CLIFF_FACTOR else RISK_BELOW_COLLAPSE
        c.risk_why = f"{k} {learning_lrs(rows[key])[k]:g} raised, and a trial at {ratio:.3g}x it collapsed ({tid})"
