"""The baseline methods: each a proposal strategy plugged into one shared two-stage driver."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.baselines.common import Budget, MethodResult, TrialOutcome, run_trial
from bench.baselines.space import (
    REDRAWS,
    config_key,
    defaults_params,
    focused,
    grid_points,
    optuna_suggest,
    random_overrides,
    repair,
    valid,
)
from mart.state.metrics import StepRecord
from mart.state.search_space import SearchSpace
from mart.trial_runner.base import Backend


def _n_devices(base: dict[str, Any]) -> int:
    try:
        return int(base.get("trainer.n_gpus_per_node", 1)) * int(base.get("trainer.nnodes", 1))
    except (TypeError, ValueError):
        return 1


class Strategy:
    """Draws overrides for trial ``i`` of a stage (0 is always the defaults) and learns from outcomes.

    ``draw`` makes one raw proposal; the shared driver (``run_method``) repairs it onto verl's constraints,
    drops it when it is still invalid or a config already run, and asks again, up to ``REDRAWS`` draws
    per trial for every method. ``commit``/``discard`` tell the strategy which draws were kept.
    """

    restricted = False

    def bind(self, backend: Backend, base: dict[str, Any], budget: Budget, seed: int, limit_gb: float | None) -> None:
        full = backend.search_space()
        self.backend, self.base, self.budget, self.seed, self.limit_gb = backend, base, budget, seed, limit_gb
        self.space: SearchSpace = focused(full) if self.restricted else full

    def start_learning(self, base: dict[str, Any]) -> None:
        self.base = base

    def first(self, stage: str) -> dict[str, Any]:
        """Trial 1 of a stage: the defaults."""
        return {}

    def draw(self, stage: str, i: int) -> dict[str, Any] | None:
        """One raw proposal; None when the method has nothing more to propose (a finished grid)."""
        return None

    def commit(self, stage: str, raw: dict[str, Any], overrides: dict[str, Any]) -> None:
        """``raw`` was kept as ``overrides`` (after repair) and will run."""

    def discard(self, stage: str, raw: dict[str, Any], previous: TrialOutcome | None) -> None:
        """``raw`` will not run: invalid after repair (``previous`` None) or a config that already ran."""

    def tell(self, stage: str, overrides: dict[str, Any], outcome: TrialOutcome) -> None:
        pass

    def pruner(self) -> Callable[[list[StepRecord]], bool] | None:
        return None

    def steps(self, stage: str, overrides: dict[str, Any]) -> int | None:
        """Steps of a short probe run for these overrides; None = a full trial (the stage's horizon)."""
        return None


def charge_probe(out: TrialOutcome, records: list[StepRecord], n_devices: int) -> None:
    """Turn a short run into a fit probe: it measures memory only (no throughput, never picked), and its
    GPU-hours are the start-up and the training passes (``PROBE_SKIPS`` phases are not charged)."""
    out.probe = True
    out.throughput = None
    out.feasible = False
    skipped = sum(r.data.get(k, 0.0) for r in records if r.step >= 1 for k in PROBE_SKIPS
                  if isinstance(r.data.get(k), float) and math.isfinite(r.data[k]))
    cut = skipped * n_devices / 3600.0
    out.gpu_hours = max(0.0, out.gpu_hours - cut)
    out.planned_gpu_hours = max(out.gpu_hours, out.planned_gpu_hours - cut)


class DefaultOnly(Strategy):
    """verl's defaults: one trial per stage, nothing tuned."""


class RandomSearch(Strategy):
    def bind(self, *a: Any) -> None:
        super().bind(*a)
        self.rng = random.Random(self.seed)

    def draw(self, stage: str, i: int) -> dict[str, Any] | None:
        return random_overrides(self.space, stage, self.base, self.rng)


class GridSearch(Strategy):
    """A full grid over the first knobs of each stage (verl's perf-guide order) that fits the budget."""

    def bind(self, *a: Any) -> None:
        super().bind(*a)
        self.points = iter(grid_points(self.space, "system", self.base, self.budget.system_trials))

    def start_learning(self, base: dict[str, Any]) -> None:
        super().start_learning(base)
        self.points = iter(grid_points(self.space, "learning", base, self.budget.learning_trials))

    def draw(self, stage: str, i: int) -> dict[str, Any] | None:
        return next(self.points, None)


class OptunaSampler(Strategy):
    """An Optuna sampler through ask-and-tell; the defaults are enqueued as the first trial of each stage.

    Stage 1: OOM, failure and a peak over the margin are constraint violations (``Trial.set_constraint``,
    which TPE reads; it replaced ``constraints_func`` in Optuna 5) with the throughput measured or 0; for
    samplers without constraint support (CMA-ES) an infeasible trial is told 0. Stage 2: a median pruner
    on the intermediate validation scores. A repaired draw is told FAIL and its repaired config enqueued,
    so the sampler learns from the config that ran; a draw that repeats a config already run is told that
    run's result instead of running it again (optuna#3472).
    """

    uses_constraints = True

    def make_sampler(self, seed: int, n_trials: int):
        raise NotImplementedError

    def bind(self, *a: Any) -> None:
        super().bind(*a)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.optuna = optuna
        self.study = self._study("system", self.seed, self.budget.system_trials, self.base)
        self.current = None

    def _study(self, stage: str, seed: int, n: int, base: dict[str, Any], pruner=None):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature warnings of the samplers
            study = self.optuna.create_study(direction="maximize", sampler=self.make_sampler(seed, n), pruner=pruner)
        study.enqueue_trial(defaults_params(self.space, stage, base))
        return study

    def start_learning(self, base: dict[str, Any]) -> None:
        super().start_learning(base)
        test_freq = int(base.get("trainer.test_freq", 5) or 5)
        pruner = self.optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=max(1, test_freq))
        self.study = self._study("learning", self.seed + 1, self.budget.learning_trials, base, pruner)

    def first(self, stage: str) -> dict[str, Any]:
        return self.draw(stage, 0)  # the enqueued defaults, so the sampler sees that trial

    def draw(self, stage: str, i: int) -> dict[str, Any] | None:
        self.current = self.study.ask()
        return optuna_suggest(self.current, self.space, stage)

    def commit(self, stage: str, raw: dict[str, Any], overrides: dict[str, Any]) -> None:
        if overrides != raw:  # tell the sampler the config that runs, not the draw
            self.study.tell(self.current, state=self.optuna.trial.TrialState.FAIL)
            self.study.enqueue_trial({**raw, **overrides})
            self.current = self.study.ask()
            optuna_suggest(self.current, self.space, stage)

    def discard(self, stage: str, raw: dict[str, Any], previous: TrialOutcome | None) -> None:
        if previous is None:
            self.study.tell(self.current, state=self.optuna.trial.TrialState.FAIL)
        else:
            self.tell(stage, raw, previous, pruned_ok=False)
        self.current = None

    def tell(self, stage: str, overrides: dict[str, Any], outcome: TrialOutcome, pruned_ok: bool = True) -> None:
        if self.current is None:
            return
        states = self.optuna.trial.TrialState
        if stage == "system":
            thr = outcome.throughput if outcome.status == "completed" and outcome.throughput is not None else 0.0
            if outcome.status != "completed":
                violation = 1e3
            elif self.limit_gb is not None and outcome.peak_memory_gb is not None:
                violation = outcome.peak_memory_gb - self.limit_gb
            else:
                violation = 0.0
            if self.uses_constraints:
                self.current.set_constraint("memory_margin", violation)
            elif violation > 0:
                thr = 0.0
            self.study.tell(self.current, thr)
        elif outcome.early_stopped and pruned_ok:
            self.study.tell(self.current, state=states.PRUNED)
        elif outcome.score is not None and (outcome.status == "completed" or outcome.early_stopped):
            self.study.tell(self.current, outcome.score)
        else:
            self.study.tell(self.current, state=states.FAIL)
        self.current = None

    def pruner(self) -> Callable[[list[StepRecord]], bool] | None:
        prefix = self.backend.score_metric_prefix
        reported: dict[int, set[int]] = {}

        def should_stop(records: list[StepRecord]) -> bool:
            trial = self.current
            if trial is None:
                return False
            done = reported.setdefault(trial.number, set())
            for rec in records:
                vals = [v for k, v in rec.data.items() if k.startswith(prefix) and not math.isnan(v)]
                if vals and rec.step > 0 and rec.step not in done:
                    trial.report(vals[0], rec.step)
                    done.add(rec.step)
            return trial.should_prune()

        return should_stop


class TPE(OptunaSampler):
    """Multivariate TPE (Optuna 5's default flavour), a third of the budget as random start-up trials."""

    def make_sampler(self, seed: int, n_trials: int):
        return self.optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, n_trials // 3), multivariate=True)


class TPERestricted(TPE):
    restricted = True


class CMAES(OptunaSampler):
    """Optuna's CMA-ES (the ``cmaes`` package). Categorical knobs fall back to its independent (random)
    sampler, as Optuna documents. Its default population (4 + 3 ln d, 12-14 here) would not finish one
    generation within a 10-trial budget, so the population is 4 (a common small-budget setting)."""

    uses_constraints = False

    def make_sampler(self, seed: int, n_trials: int):
        return self.optuna.samplers.CmaEsSampler(seed=seed, popsize=4, n_startup_trials=1,
                                                 warn_independent_sampling=False)


class CMAESRestricted(CMAES):
    restricted = True


#: phases a fit probe does not run: with dummy weights it only times the training passes at the shape
#: (AReaL's probe, SkyRL's profiling step); the sim's 1-step trial also generates, which is not charged
PROBE_SKIPS = ("timing_s/gen", "timing_s/update_weights", "timing_s/reward", "timing_s/adv")
PROBE_STEPS = 1
#: a probe runs one step without validation (trainer.* keys are not catalogue knobs)
PROBE_FLAGS = {"trainer.val_before_train": False, "trainer.test_freq": -1}


class FitLargest(Strategy):
    """The "fit the largest" auto-tuners RL frameworks ship. AReaL's ``--tune-params`` probes candidate
    micro-batch shapes from the largest down (with dummy weights) and keeps the first whose peak memory is
    <= 0.9 of the card; SkyRL's automatic micro batch (NovaSky-AI/SkyRL#1060) runs a forward and backward
    pass per candidate and keeps the largest that fits. In verl's terms: dynamic bsz with a token cap per
    micro batch (``ppo_max_token_len_per_gpu``, which verl's yaml also gives the log-prob passes), probed
    from the focused range's largest cap down by halves (never below the longest sequence: verl's rule);
    each probe is a 1-step run without validation whose cost is its start-up and training passes (as a
    dummy-weight probe's); the first probe whose peak is within the margin (0.9 of the card at the
    benchmark's 10%) is then run as a full trial. Stage 2 is left at the defaults (these tuners fit
    shapes, not learning knobs). Everything else stays the job's own config."""

    def bind(self, *a: Any) -> None:
        super().bind(*a)
        cap = self.space[_CAP] if _CAP in self.space else None
        hi = int(min(65536, cap.high)) if cap is not None and cap.high else 65536
        seq = int(self.base.get("data.max_prompt_length", 512)) + int(self.base.get("data.max_response_length", 512))
        ladder = []
        c = hi
        while c >= seq and c >= 1024:
            ladder.append(c)
            c //= 2
        self.ladder = ladder or [max(seq, 1024)]
        self.pos = 0
        self.found: int | None = None
        self.done = False

    @staticmethod
    def shape(cap: int) -> dict[str, Any]:
        return {_A + "use_dynamic_bsz": True, _CAP: int(cap)}

    def draw(self, stage: str, i: int) -> dict[str, Any] | None:
        if stage != "system" or self.done:
            return None
        if self.found is not None:  # the shape that fits, measured as a full trial
            self.done = True
            return self.shape(self.found)
        if self.pos >= len(self.ladder):
            return None  # nothing fits: the defaults stay
        return {**self.shape(self.ladder[self.pos]), **PROBE_FLAGS}

    def steps(self, stage: str, overrides: dict[str, Any]) -> int | None:
        return PROBE_STEPS if all(overrides.get(k) == v for k, v in PROBE_FLAGS.items()) else None

    def tell(self, stage: str, overrides: dict[str, Any], outcome: TrialOutcome) -> None:
        if stage != "system" or not outcome.probe:
            return
        self.pos += 1
        fits = (outcome.status == "completed" and outcome.peak_memory_gb is not None
                and (self.limit_gb is None or outcome.peak_memory_gb <= self.limit_gb))
        if fits:
            self.found = int(overrides[_CAP])


_A = "actor_rollout_ref.actor."
_CAP = _A + "ppo_max_token_len_per_gpu"


METHODS: dict[str, Callable[[], Strategy]] = {
    "fit-largest": FitLargest,
    "default": DefaultOnly,
    "random": RandomSearch,
    "grid": GridSearch,
    "tpe": TPE,
    "tpe-restricted": TPERestricted,
    "cmaes": CMAES,
    "cmaes-restricted": CMAESRestricted,
}


def run_method(method: str, backend: Backend, *, scenario: str, seed: int, budget: Budget, workdir: Path) -> MethodResult:
    """Run one baseline's two stages on ``backend`` and return every trial it paid for.

    ``result.extra``: ``draws`` (raw proposals per stage), ``invalid_draws`` (still invalid after repair),
    ``duplicate_draws`` (configs already run), ``no_valid_candidate`` (stage -> the trial number for which
    ``REDRAWS`` draws produced nothing valid; the stage stops there instead of running the defaults again).
    """
    strategy = METHODS[method]()
    t0 = time.monotonic()
    base = dict(backend.base_config())
    capacity = backend.memory_capacity_gb()
    limit = None if capacity is None else (1 - budget.memory_margin) * capacity
    strategy.bind(backend, base, budget, seed, limit)
    runner = backend.make_runner()
    result = MethodResult(method=method, scenario=scenario, seed=seed)
    counts = {k: {"system": 0, "learning": 0} for k in ("draws", "invalid_draws", "duplicate_draws")}
    result.extra.update(counts)
    result.extra["no_valid_candidate"] = {}
    n_dev = _n_devices(base)
    workdir.mkdir(parents=True, exist_ok=True)

    def propose(name: str, i: int, stage_base: dict[str, Any], ran: dict[str, TrialOutcome]) -> dict[str, Any] | None:
        for _ in range(REDRAWS):
            raw = strategy.draw(name, i)
            if raw is None:
                return None
            counts["draws"][name] += 1
            over = repair(strategy.space, stage_base, raw)
            key = config_key(stage_base, over)
            if key in ran:
                counts["duplicate_draws"][name] += 1
                strategy.discard(name, raw, ran[key])
            elif not valid(strategy.space, stage_base, over):
                counts["invalid_draws"][name] += 1
                strategy.discard(name, raw, None)
            else:
                strategy.commit(name, raw, over)
                return over
        result.extra["no_valid_candidate"][name] = i + 1
        return None

    def stage(name: str, n: int, horizon: int, stage_base: dict[str, Any],
              prune: Callable[[list[StepRecord]], bool] | None) -> None:
        ran: dict[str, TrialOutcome] = {}
        for i in range(n):
            if i == 0:  # everyone's trial 1: the defaults (the Optuna samplers' enqueued trial)
                over = strategy.first(name)
            else:
                over = propose(name, i, stage_base, ran)
            if over is None:
                break
            probe_steps = strategy.steps(name, over)
            records: list[StepRecord] = []
            out = run_trial(backend, runner, trial_id=f"{method}-{name[:3]}-{i + 1:02d}", stage=name, seq=i + 1,
                            base=stage_base, overrides=over, steps=probe_steps or horizon, workdir=workdir, seed=seed,
                            limit_gb=limit, poll_sleep_s=budget.poll_sleep_s, on_records=prune, n_devices=n_dev,
                            records_out=records)
            if probe_steps:
                charge_probe(out, records, n_dev)
            result.trials.append(out)
            ran[config_key(stage_base, over)] = out
            strategy.tell(name, over, out)
            if method == "default":
                break

    try:
        stage("system", budget.system_trials, budget.system_horizon, base, None)
        sys_trials = [t for t in result.trials if t.stage == "system" and t.feasible and t.throughput is not None]
        if sys_trials:
            best = max(sys_trials, key=lambda t: t.throughput)
            result.best_system, result.best_throughput = best.overrides, best.throughput
        base2 = {**base, **result.best_system}
        strategy.start_learning(base2)
        if budget.learning_trials > 0:
            stage("learning", budget.learning_trials, budget.learning_horizon, base2, strategy.pruner())
        learn = [t for t in result.trials if t.stage == "learning" and t.feasible]
        if learn:  # ranked by the measured score: what a user of the method would pick
            best = max(learn, key=lambda t: t.score)
            result.best_learning, result.best_score = best.overrides, best.score
    except Exception as e:  # noqa: BLE001 - keep the partial result; the table marks the method
        result.error = f"{type(e).__name__}: {e}"
    finally:
        runner.close()
    result.wall_s = time.monotonic() - t0
    return result
