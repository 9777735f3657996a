"""The baseline methods: each a proposal strategy plugged into one shared two-stage driver."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.baselines.common import Budget, MethodResult, TrialOutcome, run_trial
from bench.baselines.space import defaults_params, grid_points, optuna_suggest, random_overrides, valid
from mart.state.metrics import StepRecord
from mart.trial_runner.base import Backend

Propose = Callable[[int], "dict[str, Any] | None"]
Tell = Callable[[dict[str, Any], TrialOutcome], None]


def _n_devices(base: dict[str, Any]) -> int:
    try:
        return int(base.get("trainer.n_gpus_per_node", 1)) * int(base.get("trainer.nnodes", 1))
    except (TypeError, ValueError):
        return 1


class Strategy:
    """Proposes overrides for trial ``i`` of a stage (0 is always the defaults) and learns from outcomes."""

    def system(self, i: int) -> dict[str, Any] | None:
        return None

    def tell_system(self, overrides: dict[str, Any], outcome: TrialOutcome) -> None:
        pass

    def learning(self, i: int) -> dict[str, Any] | None:
        return None

    def tell_learning(self, overrides: dict[str, Any], outcome: TrialOutcome) -> None:
        pass

    def pruner(self) -> Callable[[list[StepRecord]], bool] | None:
        return None

    def bind(self, backend: Backend, base: dict[str, Any], budget: Budget, seed: int, limit_gb: float | None) -> None:
        self.backend, self.space, self.base, self.budget, self.seed, self.limit_gb = (
            backend, backend.search_space(), base, budget, seed, limit_gb)

    def start_learning(self, base: dict[str, Any]) -> None:
        self.base = base


class DefaultOnly(Strategy):
    """verl's defaults: one trial per stage, nothing tuned."""


class RandomSearch(Strategy):
    def bind(self, *a: Any) -> None:
        super().bind(*a)
        self.rng = random.Random(self.seed)

    def system(self, i: int) -> dict[str, Any] | None:
        return random_overrides(self.space, "system", self.base, self.rng)

    def learning(self, i: int) -> dict[str, Any] | None:
        return random_overrides(self.space, "learning", self.base, self.rng)


class GridSearch(Strategy):
    """A full grid over the first knobs of each stage (verl's perf-guide order) that fits the budget."""

    def bind(self, *a: Any) -> None:
        super().bind(*a)
        self.points = grid_points(self.space, "system", self.base, self.budget.system_trials)

    def system(self, i: int) -> dict[str, Any] | None:
        return self.points[i] if i < len(self.points) else None

    def start_learning(self, base: dict[str, Any]) -> None:
        super().start_learning(base)
        self.points = grid_points(self.space, "learning", base, self.budget.learning_trials)

    def learning(self, i: int) -> dict[str, Any] | None:
        return self.points[i] if i < len(self.points) else None


class OptunaTPE(Strategy):
    """Optuna's TPE through ask-and-tell over the same knobs; constrained TPE for the memory margin in
    stage 1 (OOM = worst value, infeasible); a median pruner on the intermediate validation scores in
    stage 2. The defaults are enqueued as the first trial of each stage."""

    def bind(self, *a: Any) -> None:
        super().bind(*a)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        n1 = self.budget.system_trials
        # constrained TPE: optuna 5 reads constraints set with Trial.set_constraint (feasible when <= 0)
        sampler = optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=max(3, n1 // 3), multivariate=True)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.study.enqueue_trial(defaults_params(self.space, "system", self.base))
        self.current = None

    def _ask(self, study, stage: str) -> dict[str, Any] | None:
        for _ in range(50):  # configs verl refuses are told FAIL and never launched (no budget spent)
            trial = study.ask()
            over = optuna_suggest(trial, self.space, stage)
            if valid(self.space, self.base, over):
                self.current = trial
                return over
            study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        return None

    def system(self, i: int) -> dict[str, Any] | None:
        return self._ask(self.study, "system")

    def tell_system(self, overrides: dict[str, Any], outcome: TrialOutcome) -> None:
        if self.current is None:
            return
        thr = outcome.throughput if outcome.status == "completed" and outcome.throughput is not None else 0.0
        if outcome.status != "completed":
            violation = 1e3
        elif self.limit_gb is not None and outcome.peak_memory_gb is not None:
            violation = outcome.peak_memory_gb - self.limit_gb
        else:
            violation = 0.0
        self.current.set_constraint("memory_margin", violation)
        self.study.tell(self.current, thr)
        self.current = None

    def start_learning(self, base: dict[str, Any]) -> None:
        super().start_learning(base)
        n2 = self.budget.learning_trials
        sampler = self.optuna.samplers.TPESampler(seed=self.seed + 1, n_startup_trials=max(2, n2 // 3), multivariate=True)
        test_freq = int(base.get("trainer.test_freq", 5) or 5)
        pruner = self.optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=max(1, test_freq))
        self.lstudy = self.optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
        self.lstudy.enqueue_trial(defaults_params(self.space, "learning", base))

    def learning(self, i: int) -> dict[str, Any] | None:
        return self._ask(self.lstudy, "learning")

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

    def tell_learning(self, overrides: dict[str, Any], outcome: TrialOutcome) -> None:
        if self.current is None:
            return
        states = self.optuna.trial.TrialState
        if outcome.early_stopped:
            self.lstudy.tell(self.current, state=states.PRUNED)
        elif outcome.status == "completed" and outcome.score is not None:
            self.lstudy.tell(self.current, outcome.score)
        else:
            self.lstudy.tell(self.current, state=states.FAIL)
        self.current = None


METHODS: dict[str, Callable[[], Strategy]] = {
    "default": DefaultOnly,
    "random": RandomSearch,
    "grid": GridSearch,
    "optuna": OptunaTPE,
}


def run_method(method: str, backend: Backend, *, scenario: str, seed: int, budget: Budget, workdir: Path) -> MethodResult:
    """Run one baseline's two stages on ``backend`` and return every trial it paid for."""
    strategy = METHODS[method]()
    t0 = time.monotonic()
    base = dict(backend.base_config())
    capacity = backend.memory_capacity_gb()
    limit = None if capacity is None else (1 - budget.memory_margin) * capacity
    strategy.bind(backend, base, budget, seed, limit)
    runner = backend.make_runner()
    result = MethodResult(method=method, scenario=scenario, seed=seed)
    n_dev = _n_devices(base)
    workdir.mkdir(parents=True, exist_ok=True)

    def stage(name: str, n: int, horizon: int, stage_base: dict[str, Any], propose: Propose, tell: Tell,
              prune: Callable[[list[StepRecord]], bool] | None) -> None:
        for i in range(n):
            over = {} if i == 0 else propose(i)
            if i == 0 and method == "optuna":
                over = propose(i) or {}  # optuna's enqueued defaults (so TPE sees the trial)
            if over is None:
                break
            out = run_trial(backend, runner, trial_id=f"{method}-{name[:3]}-{i + 1:02d}", stage=name, seq=i + 1,
                            base=stage_base, overrides=over, steps=horizon, workdir=workdir, seed=seed,
                            limit_gb=limit, poll_sleep_s=budget.poll_sleep_s, on_records=prune, n_devices=n_dev)
            result.trials.append(out)
            tell(over, out)
            if method == "default":
                break

    try:
        stage("system", budget.system_trials, budget.system_horizon, base, strategy.system, strategy.tell_system, None)
        sys_trials = [t for t in result.trials if t.stage == "system" and t.feasible and t.throughput is not None]
        if sys_trials:
            best = max(sys_trials, key=lambda t: t.throughput)
            result.best_system, result.best_throughput = best.overrides, best.throughput
        base2 = {**base, **result.best_system}
        strategy.start_learning(base2)
        if budget.learning_trials > 0:
            stage("learning", budget.learning_trials, budget.learning_horizon, base2, strategy.learning,
                  strategy.tell_learning, strategy.pruner())
        learn = [t for t in result.trials if t.stage == "learning" and t.feasible]
        if learn:
            best = max(learn, key=lambda t: t.score)
            result.best_learning, result.best_score = best.overrides, best.score
    except Exception as e:  # noqa: BLE001 - keep the partial result; the table marks the method
        result.error = f"{type(e).__name__}: {e}"
    finally:
        runner.close()
    result.wall_s = time.monotonic() - t0
    return result
