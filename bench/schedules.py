"""Stage 3's benchmark: training schedules vs the best static config, at equal total training steps.

At ``T`` total steps, 5 seeds per scenario, on the simulator (``python bench/compare.py --schedule ...`` or
``python bench/schedules.py ...``):

* ``grid`` - the best static learning config of a grid over the stage-2 learning knobs (``GRID``:
  lr x clip-higher x entropy bonus, 12 configs), each trained once for ``T`` steps from the base model and
  ranked by its measured final validation score; budget = 12 full-length trials (= 12 x S segment-trials).
* ``random`` - random schedules: the start config for the first segment (the same start as mart's), then
  S - 1 segments each with a random valid config of the focused learning space (``mart.trial_runner.verl
  .focus``), drawn, repaired and redrawn exactly as ``bench/baselines/space.py`` does for every baseline;
  the schedules share the first segment's trial and together spend mart's budget in segment-trials; the
  best by measured final validation wins.
* ``mart`` - a session ``--stages schedule`` from the same start config (verl's defaults), rules agents,
  ``--approve auto``, through the session API ``bench/compare.py`` uses (once stage 3 is in this build).

``--start grid`` starts mart's and random's schedules from the grid's pick of the same seed instead (does a
schedule add to the best static config found?); the grid's trials then come on top of their budgets.

Every trial runs through the simulator backend's own runner (``TrialSpec.save_steps`` / ``init_from``: a
segment branches from its parent's checkpoint), so every method sees the same measurement noise. Reported
per method: the chosen schedule's noise-free expected final score (``schedule_score_noise_free``, over the
collapse draw), its relative gain over grid search (per seed; median and range), the segment-trials and
simulated GPU-hours the search spent, and the GPU-hours of one training run with the chosen schedule. The
``static optimum`` line is the noise-free best of the simulator's 864-config learning grid at ``T`` steps (a
reference, not a method). The issue's target is mart >= +6% relative over grid in median; the figures are
reported as they fall.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.baselines.space import REDRAWS, config_key, repair, sample_param, valid  # noqa: E402

A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
SCENARIOS = ["qwen3-8b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-1x8", "qwen3-0.6b-2x8"]
QUICK_SCENARIOS = ["qwen3-0.6b-1x8", "qwen3-8b-1x8"]
METHODS = ["grid", "grid-eq", "random", "pb2", "pbt", "mart"]
DEFAULT_METHODS = ["grid", "grid-eq", "random", "pb2", "mart"]
#: the reference of the issue's target: the grid given the GPU-hours the schedules get (``grid-eq``)
REFERENCE = "grid-eq"

#: the static grid: the stage-2 knobs with the largest effects on the simulator and in the GRPO recipes
#: (lr 1x/2x/4x verl's default, clip-higher as DAPO, a small entropy bonus), everything else the start config's
GRID: dict[str, list[Any]] = {
    A + "optim.lr": [1e-6, 2e-6, 4e-6],
    A + "clip_ratio_high": [0.2, 0.28],
    A + "entropy_coeff": [0.0, 0.001],
}
START_TEXT = {"defaults": "verl's defaults (mart and random)",
              "grid": "the grid's pick of the same seed (mart and random; the grid's trials come on top of theirs)"}
#: the issue's target: LLMZero's floor over grid search
TARGET_GAIN_PCT = 6.0


@dataclass
class ScheduleBudget:
    total_steps: int = 60
    segments: int = 4
    branches: int = 3
    budget: int | None = None  # segment-trials for mart and random search (default S x K, as mart's stage)

    def __post_init__(self) -> None:
        if self.budget is None:
            self.budget = self.segments * self.branches
        if self.total_steps < self.segments:
            raise ValueError(f"{self.segments} segments need at least as many steps (got {self.total_steps})")

    def boundaries(self) -> list[int]:
        """Segment ends, as mart's stage cuts them (``TuneOptions.schedule_boundaries``: round(i x T / S))."""
        t, s = self.total_steps, self.segments
        return [max(i, round(i * t / s)) for i in range(1, s + 1)]


@dataclass
class MethodRun:
    method: str
    scenario: str
    seed: int
    segments: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)  # chosen: (from, to, overrides)
    measured: float | None = None  # the chosen schedule's measured final validation score
    segment_trials: int = 0
    segment_trials_equivalent: int | None = None  # grid-eq: full-length trials x segments
    gpu_hours: float = 0.0  # spent by the search
    schedule_gpu_hours: float | None = None  # one training run with the chosen schedule
    noise_free: float | None = None
    error: str | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- trials
class Player:
    """Plays segment trials of one (scenario, seed) through the sim backend's runner."""

    def __init__(self, backend: Any, workdir: Path, seed: int) -> None:
        self.backend, self.workdir, self.seed = backend, workdir, seed
        self.base = dict(backend.base_config())
        self.runner = backend.make_runner()
        self.n = 0
        self.gpu_hours = 0.0
        self.failures: list[str] = []

    def play(self, overrides: dict[str, Any], from_step: int, to_step: int,
             parent_dir: str | None) -> tuple[float | None, str, float]:
        """One segment: steps from_step+1..to_step of base+overrides, from ``parent_dir``'s checkpoint at
        ``from_step`` (None: the base model). Returns (measured final validation score, trial dir, GPU-hours)."""
        from mart.state.objectives import learning_score
        from mart.state.trials import CheckpointRef, TrialSpec, checkpoint_dir

        self.n += 1
        trial_dir = str(self.workdir / f"t{self.n:04d}")
        init = None
        if from_step > 0:
            assert parent_dir is not None
            init = CheckpointRef(path=checkpoint_dir(parent_dir, from_step), step=from_step)
        spec = TrialSpec(trial_id=f"t{self.n:04d}", config={**self.base, **overrides}, steps=to_step,
                         trial_dir=trial_dir, memory_capacity_gb=self.backend.memory_capacity_gb(), seed=self.seed,
                         save_steps=[to_step], init_from=init)
        handle = self.runner.launch(spec)
        while not self.runner.poll(handle).status.is_finished():
            pass
        records = self.runner.read_all_metrics(handle)
        end = self.runner.poll(handle)
        ok = end.status.value == "completed"
        if not ok:
            self.failures.append(f"{end.status.value}: {(end.reason or '')[:160]}")
        score = learning_score(records) if ok else math.nan  # an OOM or failed segment leaves no checkpoint
        try:
            hours = float(json.loads((Path(trial_dir) / "sim_state.json").read_text())["gpu_hours"])
        except (OSError, KeyError, ValueError):
            hours = 0.0
        self.gpu_hours += hours
        return (None if math.isnan(score) else score), trial_dir, hours

    def close(self) -> None:
        self.runner.close()


def grid_points() -> list[dict[str, Any]]:
    import itertools

    keys = list(GRID)
    return [{k: v for k, v in zip(keys, values)} for values in itertools.product(*GRID.values())]


def run_grid(player: Player, bud: ScheduleBudget, start: dict[str, Any], res: MethodRun) -> None:
    best: tuple[float, dict[str, Any], float] | None = None
    for over in grid_points():
        cfg = {**start, **over}
        score, _, hours = player.play(cfg, 0, bud.total_steps, None)
        if score is not None and (best is None or score > best[0]):
            best = (score, cfg, hours)
    if best is not None:
        res.measured, res.schedule_gpu_hours = best[0], best[2]
        res.segments = [(0, bud.total_steps, best[1])]
    res.extra["grid_trials"] = len(grid_points())


def grid_eq_points(k: int) -> list[dict[str, Any]]:
    """The ``k`` grid points a grid at the schedules' budget runs: the lr axis first (the knob with the largest
    effect), then the rest of ``GRID`` in its order."""
    pts = grid_points()
    lr_axis = [p for p in pts if all(p[key] == vals[0] for key, vals in GRID.items() if key != A + "optim.lr")]
    return (lr_axis + [p for p in pts if p not in lr_axis])[:max(1, k)]


def run_grid_eq(player: Player, bud: ScheduleBudget, start: dict[str, Any], res: MethodRun) -> None:
    """Grid search at the schedules' budget: as many full-length trials as the budget holds segment-trials for
    (``budget // segments``: the same GPU-hours as a schedule search of the start config's segments)."""
    best: tuple[float, dict[str, Any], float] | None = None
    points = grid_eq_points(bud.budget // bud.segments)
    for over in points:
        cfg = {**start, **over}
        score, _, hours = player.play(cfg, 0, bud.total_steps, None)
        if score is not None and (best is None or score > best[0]):
            best = (score, cfg, hours)
    if best is not None:
        res.measured, res.schedule_gpu_hours = best[0], best[2]
        res.segments = [(0, bud.total_steps, best[1])]
    res.extra["grid_trials"] = len(points)
    res.segment_trials_equivalent = len(points) * bud.segments


# ---------------------------------------------------------------------------------------------- PB2 / PBT
#: the knobs a population-based search moves: those mart's transitions move (lr, clip-higher, entropy bonus,
#: temperature, the KL anchor, and the capacity knobs response limit and rollout n), as PB2's continuous bounds
PBT_BOUNDS: dict[str, tuple[float, float]] = {
    "log10_lr": (-7.0, -5.0),  # lr 1e-7..1e-5, the focused space's range, searched on a log scale
    "clip_high": (0.2, 0.32),
    "entropy": (0.0, 0.005),
    "temperature": (0.6, 1.2),
    "kl": (0.0, 0.02),  # <= 1e-4: no KL loss, else use_kl_loss with this coefficient
    "limit_mult": (1.0, 3.0),  # data.max_response_length as a multiple of the start's (DeepScaleR: x1 -> x3)
    "n_mult": (1.0, 2.0),  # rollout.n as a multiple of the start's
}


def pbt_point(cfg: dict[str, Any], start: dict[str, Any]) -> dict[str, float]:
    """A full config as PB2's point (the inverse of ``pbt_config``)."""
    kl = float(cfg.get(A + "kl_loss_coef", 0.001)) if cfg.get(A + "use_kl_loss") else 0.0
    return {"log10_lr": math.log10(float(cfg.get(A + "optim.lr", 1e-6))),
            "clip_high": float(cfg.get(A + "clip_ratio_high", 0.2)), "entropy": float(cfg.get(A + "entropy_coeff", 0.0)),
            "temperature": float(cfg.get(R + "temperature", 1.0)), "kl": kl,
            "limit_mult": float(cfg["data.max_response_length"]) / float(start["data.max_response_length"]),
            "n_mult": float(cfg[R + "n"]) / float(start[R + "n"])}


def pbt_config(point: dict[str, float], start: dict[str, Any]) -> dict[str, Any]:
    """PB2's point as a full config: the start's, with the population's knobs set (integers rounded to what verl
    takes: the response limit to 256 tokens, rollout n to an integer)."""
    clamp = {k: min(hi, max(lo, float(point[k]))) for k, (lo, hi) in PBT_BOUNDS.items()}
    cfg = {**start, A + "optim.lr": float(f"{10 ** clamp['log10_lr']:.3g}"), A + "clip_ratio_high": round(clamp["clip_high"], 3),
           A + "entropy_coeff": round(clamp["entropy"], 5), R + "temperature": round(clamp["temperature"], 3),
           A + "use_kl_loss": clamp["kl"] > 1e-4,
           "data.max_response_length": int(round(start["data.max_response_length"] * clamp["limit_mult"] / 256) * 256),
           R + "n": max(2, int(round(start[R + "n"] * clamp["n_mult"])))}
    if cfg[A + "use_kl_loss"]:
        cfg[A + "kl_loss_coef"] = round(clamp["kl"], 5)
    return cfg


_RAY_READY = False


def _ray_init() -> None:
    """One local Ray for the process (Tune runs its trials as actors), shut down at exit."""
    global _RAY_READY
    if _RAY_READY:
        return
    import atexit
    import os

    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    atexit.register(ray.shutdown)
    _RAY_READY = True


def pbt_trainable(config: dict[str, Any], ctx: dict[str, Any]) -> None:
    """One population member: plays the schedule's segments through the sim backend's runner, one per Tune
    iteration, each from the checkpoint PBT hands it (its own, or an exploited donor's)."""
    import uuid

    from ray import tune
    from ray.tune import Checkpoint

    from mart.trial_runner.registry import load_backend

    backend = load_backend("sim", **ctx["opts"])
    ends, start, base = ctx["ends"], ctx["start"], ctx["base"]
    player = Player(backend, Path(ctx["workdir"]) / uuid.uuid4().hex[:8], ctx["seed"])
    state: dict[str, Any] = {"segments": [], "trial_dir": None}
    ck = tune.get_checkpoint()
    if ck is not None:
        with ck.as_directory() as d:
            state = json.loads((Path(d) / "state.json").read_text())
    cfg = pbt_config(config, start)
    try:
        while len(state["segments"]) < len(ends):
            i = len(state["segments"])
            a, b = (ends[i - 1] if i else 0), ends[i]
            score, tdir, hours = player.play(cfg, a, b, state["trial_dir"])
            with open(Path(ctx["workdir"]) / "segments.jsonl", "a") as log:  # the driver's count of trials and hours
                log.write(json.dumps({"gpu_hours": hours, "score": score, "from": a, "to": b}) + "\n")
            if score is not None:
                state["segments"].append([a, b, {k: v for k, v in cfg.items() if base.get(k) != v}])
                state["trial_dir"] = tdir
                state["hours"] = state.get("hours", 0.0) + hours
            # an OOM'd or failed segment leaves the member where it was, reported worst: PBT's exploit step hands
            # it a better member's checkpoint and config at this boundary (the segment-trial is spent)
            d = Path(tempfile.mkdtemp(prefix="pbt-ck-"))
            (d / "state.json").write_text(json.dumps(state, default=str))
            tune.report({"score": -1.0 if score is None else score, "done_segments": len(state["segments"]),
                         "state": json.dumps(state, default=str)}, checkpoint=Checkpoint.from_directory(str(d)))
    finally:
        player.close()


def run_population(task: dict[str, Any], bud: ScheduleBudget, workdir: Path, res: MethodRun,
                   start: dict[str, Any], base: dict[str, Any], kind: str) -> None:
    """PB2 (Parker-Holder et al., NeurIPS 2020; Ray Tune's ``PB2``) or PBT (Jaderberg et al. 2017; ``PopulationBasedTraining``):
    a population of ``budget // segments`` members trains segment by segment; after each segment the worst
    quantile copies a top member's checkpoint and config and explores a new config (PB2: a GP-bandit over
    ``PBT_BOUNDS``; PBT: perturbations). Member 0 starts from the start config (mart's root), the others from
    draws; the budget is the same number of segment-trials as mart's. The pick: the member with the best measured
    final validation, its segments as it ran them (exploits included)."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from bench.compare import backend_options

    _ray_init()
    pop = max(2, bud.budget // bud.segments)
    opts = backend_options("sim", task["scenario"], task["seed"], task.get("scenario_file"), task.get("perturb"))
    opts["steps_per_poll"] = 10**6
    ctx = {"opts": opts, "ends": bud.boundaries(), "start": start, "base": base, "seed": task["seed"],
           "workdir": str(workdir)}
    space = {k: tune.uniform(lo, hi) for k, (lo, hi) in PBT_BOUNDS.items()}
    if kind == "pb2":
        try:
            from ray.tune.schedulers.pb2 import PB2

            sched = PB2(time_attr="training_iteration", perturbation_interval=1, synch=True, quantile_fraction=0.34,
                        hyperparam_bounds={k: list(v) for k, v in PBT_BOUNDS.items()})
        except ImportError as e:  # PB2 needs GPy and scikit-learn: fall back to PBT, and say so
            res.extra["pb2_unavailable"] = f"{type(e).__name__}: {e}; ran PBT instead"
            kind = "pbt"
    if kind == "pbt":
        sched = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=1, synch=True,
                                        quantile_fraction=0.34, hyperparam_mutations=space)
    res.extra["population"], res.extra["scheduler"] = pop, kind
    tuner = tune.Tuner(
        # a quarter CPU per member: the whole population runs at once (synchronous PBT waits for every member at
        # each boundary; members queued behind cached actors would never start), the sim's trials are light
        tune.with_resources(tune.with_parameters(pbt_trainable, ctx=ctx), {"cpu": 0.25}), param_space=space,
        tune_config=tune.TuneConfig(scheduler=sched, num_samples=pop, metric="score", mode="max", reuse_actors=True,
                                    search_alg=BasicVariantGenerator(points_to_evaluate=[pbt_point(start, start)],
                                                                     random_state=task["seed"])),
        run_config=tune.RunConfig(storage_path=str(workdir / "tune"), stop={"training_iteration": bud.segments}, verbose=int(__import__("os").environ.get("MART_TUNE_VERBOSE", "0")),
                                  name=f"{kind}-{task['scenario']}-{task['seed']}"))
    results = tuner.fit()
    best: tuple[float, dict[str, Any]] | None = None
    for r in results:
        m = r.metrics or {}
        if m.get("done_segments") == bud.segments and m.get("score", -1) >= 0 and m.get("state"):
            if best is None or m["score"] > best[0]:
                best = (float(m["score"]), json.loads(m["state"]))
    log = [json.loads(line) for line in (workdir / "segments.jsonl").read_text().splitlines()] \
        if (workdir / "segments.jsonl").exists() else []
    res.segment_trials, res.gpu_hours = len(log), sum(float(x["gpu_hours"]) for x in log)
    if best is not None:
        res.measured = best[0]
        res.segments = [(int(a), int(b), {**base, **over}) for a, b, over in best[1]["segments"]]
        res.schedule_gpu_hours = float(best[1].get("hours", 0.0))


def random_learning_config(space: Any, base: dict[str, Any], start: dict[str, Any], rng: random.Random,
                           seen: set[str]) -> dict[str, Any] | None:
    """A random valid config of the focused learning space (the draw, repair and redraw rules every
    baseline follows), None after ``REDRAWS`` invalid or repeated draws."""
    for _ in range(REDRAWS):
        over = {p.key: sample_param(p, rng) for p in space.stage_params("learning")}
        over = repair(space, {**base, **start}, over)
        cfg = {**start, **over}
        key = config_key(base, cfg)
        if valid(space, base, cfg) and key not in seen:
            seen.add(key)
            return cfg
    return None


def run_random(player: Player, bud: ScheduleBudget, start: dict[str, Any], res: MethodRun, seed: int) -> None:
    from mart.trial_runner.verl.focus import focus_space

    space = focus_space(player.backend.search_space())
    rng = random.Random(f"schedule-random-{seed}")
    ends = bud.boundaries()
    _, root_dir, root_hours = player.play(start, 0, ends[0], None)  # the shared first segment: the start config
    best: tuple[float, list, float] | None = None
    paths, seen = 0, set()
    while player.n < bud.budget:  # whole schedules from the shared root until the budget is spent
        paths += 1
        segs, parent, hours, score = [(0, ends[0], start)], root_dir, root_hours, None
        for i in range(1, bud.segments):
            if player.n >= bud.budget:
                break
            cfg = random_learning_config(space, player.base, start, rng, seen)
            if cfg is None:
                res.extra["no_valid_candidate"] = True
                break
            score, parent, h = player.play(cfg, ends[i - 1], ends[i], parent)
            hours += h
            if score is None:  # the segment did not complete: the schedule ends there, its trials spent
                res.extra["failed_segments"] = res.extra.get("failed_segments", 0) + 1
                break
            segs.append((ends[i - 1], ends[i], cfg))
        if len(segs) == bud.segments and score is not None and (best is None or score > best[0]):
            best = (score, segs, hours)
        if res.extra.get("no_valid_candidate"):
            break
    if best is not None:
        res.measured, res.segments, res.schedule_gpu_hours = best[0], best[1], best[2]
    res.extra["schedules"] = paths


# ---------------------------------------------------------------------------------------------- mart
def mart_schedule_available() -> str | None:
    """None when this build's mart has stage 3 (``--stages schedule``), else why not."""
    try:
        from mart.state.options import TuneOptions
    except ImportError as e:
        return f"mart.state.options: {e}"
    fields = getattr(TuneOptions, "model_fields", {})
    need = ("stages", "schedule_segments", "schedule_branches", "schedule_budget")
    missing = [f for f in need if f not in fields]
    return f"TuneOptions lacks {', '.join(missing)} (stage 3 is not in this build)" if missing else None


def run_mart(task: dict[str, Any], bud: ScheduleBudget, workdir: Path, res: MethodRun, start: dict[str, Any]) -> None:
    """A ``--stages schedule`` session with the rules agents and auto-approval; the schedule from its summary."""
    from bench.compare import _sim_usage_index, backend_options
    from mart.graph.session import TuneOptions, tune

    opts = TuneOptions(
        backend="sim", backend_options=backend_options("sim", task["scenario"], task["seed"], task.get("scenario_file"),
                                                       task.get("perturb")),
        approve="auto", agents="rules", runs_dir=str(workdir), seed=task["seed"], quiet=True, watch_interval_s=0.01,
        stages=["schedule"], schedule_segments=bud.segments, schedule_branches=bud.branches,
        schedule_budget=bud.budget, schedule_horizon=bud.total_steps, start_overrides=dict(task.get("start") or {}),
    )
    summary = tune(opts)
    sched = summary.get("schedule") or {}
    res.extra["summary_schedule"] = sched
    # mart reports each segment's overrides against its stage's base: the backend's base with the start's
    res.segments = [(int(s["from_step"]), int(s["to_step"]), {**start, **(s.get("overrides") or {})})
                    for s in sched.get("segments") or []]
    res.measured = sched.get("final_score")
    run_dir = Path(summary.get("run_dir") or Path(workdir) / summary["run_id"])
    usage = _sim_usage_index(run_dir)  # trial_id -> the sim's GPU-hour accounting
    n, hours = len(usage), sum(float(u.get("gpu_hours", 0.0)) for u in usage.values())
    path = [usage.get(str(s.get("trial_id")), {}) for s in sched.get("segments") or []]
    res.schedule_gpu_hours = sum(float(u.get("gpu_hours", 0.0)) for u in path) if path else None
    res.segment_trials, res.gpu_hours = n, hours


# ---------------------------------------------------------------------------------------------- one task
def run_task(task: dict[str, Any]) -> dict[str, Any]:
    from bench.compare import backend_options, sim_scenario
    from mart.trial_runner.registry import load_backend
    from mart.trial_runner.sim.learning import schedule_score_noise_free

    bud = ScheduleBudget(**task["budget"])
    res = MethodRun(method=task["method"], scenario=task["scenario"], seed=task["seed"])
    workdir = Path(tempfile.mkdtemp(prefix=f"mart-sched-{task['method']}-"))
    t0 = time.monotonic()
    where = (task.get("scenario_file"), task.get("perturb"))
    try:
        opts = backend_options("sim", task["scenario"], task["seed"], *where)
        opts["steps_per_poll"] = 10**6  # a whole trial per poll: no pruner watches the baselines' trials
        backend = load_backend("sim", **opts)
        base = dict(backend.base_config())
        start = {**base, **(task.get("start") or {})}  # the same start for mart and random: defaults or grid's pick
        res.extra["start"] = dict(task.get("start") or {})
        if task["method"] == "mart":
            run_mart(task, bud, workdir, res, start)
        elif task["method"] in ("pb2", "pbt"):
            run_population(task, bud, workdir, res, start, base, task["method"])
        else:
            player = Player(backend, workdir, task["seed"])
            try:
                run = {"grid": run_grid, "grid-eq": run_grid_eq}.get(task["method"])
                run(player, bud, start, res) if run else run_random(player, bud, start, res, task["seed"])
            finally:
                player.close()
            res.segment_trials, res.gpu_hours = player.n, player.gpu_hours
            res.extra["failures"] = player.failures
        sc = sim_scenario(task["scenario"], *where)
        if res.segments:
            res.noise_free = schedule_score_noise_free(res.segments, sc, bud.total_steps)
        # the static path of the same start: the reference a schedule must never fall below beyond the noise
        res.extra["static_path_noise_free"] = schedule_score_noise_free([(0, bud.total_steps, start)], sc, bud.total_steps)
    except Exception as e:  # noqa: BLE001 - one failing run is reported, not fatal
        res.error = f"{type(e).__name__}: {e}"
        res.extra["traceback"] = traceback.format_exc(limit=8)
    res.wall_s = time.monotonic() - t0
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)
    d = asdict(res)
    d["segments"] = [{"from_step": a, "to_step": b, "overrides": {k: v for k, v in cfg.items() if base_get(task, k) != v}}
                     for a, b, cfg in res.segments]
    return d


_BASES: dict[tuple, dict[str, Any]] = {}


def base_of(scenario: str, scenario_file: str | None, perturb: int | None) -> dict[str, Any]:
    from bench.compare import sim_scenario
    from mart.trial_runner.sim import model

    k = (scenario, scenario_file, perturb)
    if k not in _BASES:
        _BASES[k] = model.base_config(sim_scenario(*k))
    return _BASES[k]


def base_get(task: dict[str, Any], key: str) -> Any:
    return base_of(task["scenario"], task.get("scenario_file"), task.get("perturb")).get(key)


# ---------------------------------------------------------------------------------------------- report
def _stats(xs: list[float]) -> dict[str, float] | None:
    return None if not xs else {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _gains(by: dict, sc: str, seeds: list[int], m: str, ref: str) -> list[float]:
    out = []
    for s in seeds:
        g, x = by.get((sc, s, ref)), by.get((sc, s, m))
        if g and x and g.get("noise_free") and x.get("noise_free") is not None:
            out.append(100 * (x["noise_free"] / g["noise_free"] - 1))
    return out


def below_static(run: dict[str, Any]) -> bool | None:
    """Whether a mart run's pick scores below the static path of its start by more than the noise the stage
    measured (``state.schedule.TIE_Z`` x the noise of a difference: what the stage could not have seen), None
    without the figures."""
    from mart.state.schedule import TIE_Z

    noise = ((run.get("extra") or {}).get("summary_schedule") or {}).get("noise")
    static = (run.get("extra") or {}).get("static_path_noise_free")
    if noise is None or static is None or run.get("noise_free") is None:
        return None
    return run["noise_free"] < static - TIE_Z * float(noise) * math.sqrt(2)


def build_report(runs: list[dict[str, Any]], bud: ScheduleBudget, refs: dict[str, dict[str, float]],
                 methods: list[str], start: str = "defaults") -> dict[str, Any]:
    """Per scenario and overall: noise-free scores, gains over the grid at equal GPU-hours (``grid-eq``, the
    target's reference) and over the full grid (per seed), trials and GPU-hours, and for mart whether its pick
    fell below the static path beyond the noise."""
    out: dict[str, Any] = {"total_steps": bud.total_steps, "segments": bud.segments, "branches": bud.branches,
                           "budget_segment_trials": bud.budget, "grid": {k: v for k, v in GRID.items()},
                           "grid_full_trials": len(grid_points()), "grid_eq_trials": len(grid_eq_points(
                               bud.budget // bud.segments)), "reference": REFERENCE, "start": START_TEXT[start],
                           "target_gain_pct": TARGET_GAIN_PCT, "scenarios": {}, "overall": {}}
    by = {(r["scenario"], r["seed"], r["method"]): r for r in runs}
    all_gains: dict[str, dict[str, list[float]]] = {m: {"grid": [], REFERENCE: []} for m in methods}
    below: list[bool] = []
    for sc in sorted({r["scenario"] for r in runs}):
        seeds = sorted({r["seed"] for r in runs if r["scenario"] == sc})
        rep: dict[str, Any] = {**refs.get(sc, {}), "methods": {}}
        for m in methods:
            rows = [by.get((sc, s, m)) for s in seeds]
            nf = [r["noise_free"] for r in rows if r and r.get("noise_free") is not None]
            gains = {ref: _gains(by, sc, seeds, m, ref) for ref in ("grid", REFERENCE)}
            for ref in gains:
                all_gains[m][ref] += gains[ref]
            rep["methods"][m] = {
                "noise_free": _stats(nf), "gain_vs_grid_pct": _stats(gains["grid"]),
                "gain_vs_grid_eq_pct": _stats(gains[REFERENCE]),
                "vs_static_path": _stats([r["noise_free"] - r["extra"]["static_path_noise_free"] for r in rows
                                          if r and r.get("noise_free") is not None
                                          and (r.get("extra") or {}).get("static_path_noise_free") is not None]),
                "segment_trials": _stats([r["segment_trials"] for r in rows if r and not r.get("error")]),
                "gpu_hours": _stats([r["gpu_hours"] for r in rows if r and not r.get("error")]),
                "schedule_gpu_hours": _stats([r["schedule_gpu_hours"] for r in rows
                                              if r and r.get("schedule_gpu_hours") is not None]),
                "errors": [r["error"] for r in rows if r and r.get("error")],
            }
            if m == "mart":
                flags = [below_static(r) for r in rows if r]
                rep["methods"][m]["below_static_beyond_noise"] = sum(1 for f in flags if f)
                below += [f for f in flags if f is not None]
        out["scenarios"][sc] = rep
    for m in methods:
        out["overall"][m] = {"gain_vs_grid_pct": _stats(all_gains[m]["grid"]),
                             "gain_vs_grid_eq_pct": _stats(all_gains[m][REFERENCE])}
    mg = (out["overall"].get("mart") or {}).get("gain_vs_grid_eq_pct")
    out["target_met"] = None if not mg else mg["median"] >= TARGET_GAIN_PCT
    pops = [m for m in ("pb2", "pbt") if m in methods]
    if "mart" in methods and pops and mg:
        pg = out["overall"][pops[0]]["gain_vs_grid_eq_pct"]
        out["mart_vs_population"] = None if not pg else {"method": pops[0], "mart_median": mg["median"],
                                                          "population_median": pg["median"],
                                                          "at_least": mg["median"] >= pg["median"]}
    out["mart_below_static_beyond_noise"] = None if not below else {"runs": len(below), "below": sum(below)}
    out["targets"] = issue44_targets(out, by, refs, methods)
    return out


#: issue 44's targets: mart's median gain over grid-eq at least this share of the oracle's, per model family
ORACLE_SHARE = 0.6


def issue44_targets(out: dict[str, Any], by: dict, refs: dict[str, dict[str, Any]], methods: list[str]
                    ) -> dict[str, Any]:
    """Per scenario ``oracle_gain_pct`` (the noise-free best schedule from the start over grid-eq, median over
    seeds) beside ``mart_gain_pct``; per model family (``family`` of each scenario's reference, else its name)
    whether mart's median gain is at least ``ORACLE_SHARE`` of the oracle's; mart >= the population method pair by
    pair (a population run that completed no schedule counts as below mart); mart below the static path beyond
    its noise."""
    fam: dict[str, dict[str, list[float]]] = {}
    for sc, rep in out["scenarios"].items():
        oracle = refs.get(sc, {}).get("oracle_schedule_from_defaults")
        seeds = sorted({s for (c, s, _m) in by if c == sc})
        o_gains = [100 * (oracle / by[(sc, s, REFERENCE)]["noise_free"] - 1) for s in seeds
                   if oracle is not None and (by.get((sc, s, REFERENCE)) or {}).get("noise_free")]
        m_gains = _gains(by, sc, seeds, "mart", REFERENCE) if "mart" in methods else []
        rep["oracle_gain_pct"] = statistics.median(o_gains) if o_gains else None
        rep["mart_gain_pct"] = statistics.median(m_gains) if m_gains else None
        f = fam.setdefault(refs.get(sc, {}).get("family") or sc, {"oracle": [], "mart": []})
        f["oracle"] += o_gains
        f["mart"] += m_gains
    families = {}
    for name, f in fam.items():
        om = statistics.median(f["oracle"]) if f["oracle"] else None
        mm = statistics.median(f["mart"]) if f["mart"] else None
        families[name] = {"oracle_gain_pct": om, "mart_gain_pct": mm, "pairs": len(f["mart"]),
                          "share": None if not om or mm is None else mm / om,
                          "met": None if om is None or mm is None else mm >= ORACLE_SHARE * om}
    pop = next((m for m in ("pb2", "pbt") if m in methods), None)
    pairs = []
    for (sc, s, m), r in by.items():
        if m != "mart" or r.get("noise_free") is None or pop is None:
            continue
        other = (by.get((sc, s, pop)) or {}).get("noise_free")
        pairs.append(other is None or r["noise_free"] >= other)
    below = out.get("mart_below_static_beyond_noise") or {}
    return {"families": families, "oracle_share": ORACLE_SHARE,
            "mart_at_least_population": None if not pairs else {"method": pop, "pairs": len(pairs),
                                                                 "at_least": sum(pairs), "share": sum(pairs) / len(pairs)},
            "mart_below_static_beyond_noise": below.get("below")}


def _cell(st: dict[str, float] | None, fmt: str) -> str:
    if not st:
        return "—"
    s = fmt.format(st["median"])
    return s if st["min"] == st["max"] else s + f" [{fmt.format(st['min'])}–{fmt.format(st['max'])}]"


def render(report: dict[str, Any], methods: list[str]) -> str:
    lines = ["# Schedules vs static configs (simulator)", "",
             f"{report['total_steps']} total training steps, {report['segments']} segments, "
             f"{report['branches']} branches, budget {report['budget_segment_trials']} segment-trials (mart, random, "
             f"pb2/pbt: a population of {max(2, report['budget_segment_trials'] // report['segments'])}); grid-eq: "
             f"{report['grid_eq_trials']} full-length trials (the same segment-trials, the target's reference); grid: "
             f"{report['grid_full_trials']} full-length trials over `{json.dumps(report['grid'])}` (4x the budget at "
             f"4 segments); start: {report['start']}. Cells: median [min–max] over seeds. Noise-free = expected final "
             "score over the collapse draw, without measurement noise; vs static path = the pick's noise-free score "
             "minus the start config's run unchanged to T.", ""]
    for sc, rep in report["scenarios"].items():
        lines.append(f"## {sc}")
        if rep.get("static_optimum") is not None:
            lines.append(f"Defaults {rep['default']:.4f}; static optimum (noise-free best of the 864-config learning "
                         f"grid at {report['total_steps']} steps) {rep['static_optimum']:.4f}.")
        if rep.get("oracle_schedule") is not None:
            lines.append(f"Oracle schedule (noise-free beam search, each segment a config of that grid at 1x or 2x the "
                         f"response limit): {rep['oracle_schedule']:.4f} ({100 * (rep['oracle_schedule'] / rep['static_optimum'] - 1):+.2f}% "
                         f"over the static optimum); with the first segment at the start: "
                         f"{rep['oracle_schedule_from_defaults']:.4f}.")
        lines += ["", "| method | noise-free final score | gain vs grid-eq (%) | gain vs grid (%) | vs static path | "
                      "segment-trials | GPU-h spent | GPU-h of one run with the pick | errors |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m in methods:
            r = rep["methods"][m]
            extra = f" ({r['below_static_beyond_noise']} below beyond noise)" if "below_static_beyond_noise" in r else ""
            lines.append(f"| {m} | {_cell(r['noise_free'], '{:.4f}')} | {_cell(r['gain_vs_grid_eq_pct'], '{:+.2f}')} "
                         f"| {_cell(r['gain_vs_grid_pct'], '{:+.2f}')} | {_cell(r['vs_static_path'], '{:+.4f}')}{extra} "
                         f"| {_cell(r['segment_trials'], '{:g}')} | {_cell(r['gpu_hours'], '{:.0f}')} "
                         f"| {_cell(r['schedule_gpu_hours'], '{:.1f}')} | {len(r['errors']) or ''} |")
        lines.append("")
    lines.append("## Overall (all scenarios x seeds)")
    for m in methods:
        o = report["overall"][m]
        lines.append(f"- {m}: gain vs grid-eq {_cell(o['gain_vs_grid_eq_pct'], '{:+.2f}')} %, vs grid "
                     f"{_cell(o['gain_vs_grid_pct'], '{:+.2f}')} %")
    if report.get("target_met") is not None:
        lines.append(f"- target (mart ≥ +{TARGET_GAIN_PCT:g}% over grid at equal GPU-hours, median): "
                     f"{'met' if report['target_met'] else 'not met'}")
    if report.get("mart_vs_population"):
        mp = report["mart_vs_population"]
        lines.append(f"- mart ≥ {mp['method']} (median gain vs grid-eq {mp['mart_median']:+.2f}% vs "
                     f"{mp['population_median']:+.2f}%): {'yes' if mp['at_least'] else 'no'}")
    if report.get("mart_below_static_beyond_noise"):
        b = report["mart_below_static_beyond_noise"]
        lines.append(f"- mart below the static path beyond the noise: {b['below']} of {b['runs']} runs")
    t = report.get("targets") or {}
    for sc, rep in report["scenarios"].items():
        if rep.get("oracle_gain_pct") is not None:
            lines.append(f"- {sc}: oracle {rep['oracle_gain_pct']:+.2f}% vs mart "
                         f"{'—' if rep.get('mart_gain_pct') is None else format(rep['mart_gain_pct'], '+.2f')}% over grid-eq")
    for name, f in (t.get("families") or {}).items():
        if f.get("met") is not None:
            lines.append(f"- family {name}: mart {f['mart_gain_pct']:+.2f}% vs oracle {f['oracle_gain_pct']:+.2f}% "
                         f"over grid-eq ({f['pairs']} pairs): ≥ {t['oracle_share']:.0%} of the oracle's: "
                         f"{'yes' if f['met'] else 'no'}")
    if t.get("mart_at_least_population"):
        p = t["mart_at_least_population"]
        lines.append(f"- mart ≥ {p['method']} in {p['at_least']} of {p['pairs']} pairs ({p['share']:.0%})")
    return "\n".join(lines) + "\n"


def oracle_schedule(sc: Any, bud: ScheduleBudget, first: dict[str, Any] | None = None,
                    beam: int = 2, memory: bool = True) -> tuple[float, list[tuple[int, int, dict[str, Any]]]]:
    """A noise-free reference (not a method): a beam search over schedules whose segments each take a config
    of the simulator's learning grid (``model.LEARNING_GRID``, at the scenario's response limit and at twice
    it), a prefix ranked by its expected final score when its last config runs on to T. ``first``: the
    first segment's config fixed (the start mart's schedule has), else free. Says how much a schedule can
    gain over a static config on this simulator at all. Prefixes are ranked with the same estimator as the
    final score (16 quantiles of the collapse draw): with fewer, a 3-6% collapse risk rounds to zero. With
    the first segment free it is never below the static optimum: the static config is ranked first after
    segment 1 and its unchanged continuation stays a candidate at every boundary. ``memory``: only schedules
    that run count (``model.schedule_oom``: every segment fits in the GPU's memory, as the methods' trials must),
    with the start's system config or smaller micro batches (``_runs``: the memory-safe moves mart's stage 3
    may make); False prices no memory (the oracle before issue 44's fix, which counted schedules that run out
    of memory on the 0.6B scenarios)."""
    import itertools

    from mart.trial_runner.sim import model
    from mart.trial_runner.sim.learning import schedule_score_noise_free

    base = model.base_config(sc)
    keys = list(model.LEARNING_GRID)
    safe_knobs = [p for p in model.search_space(sc).params if p.memory_safe and p.kind == "int"]
    cands = []
    for values in itertools.product(*model.LEARNING_GRID.values()):
        over = dict(zip(keys, values))
        if not over[A + "use_kl_loss"] and over[A + "kl_loss_coef"] != 0.001:
            continue
        for length in (sc.max_response_length, 2 * sc.max_response_length):
            cands.append({**base, **over, "data.max_response_length": length})
    ends = bud.boundaries()
    beams: list[list[tuple[int, int, dict[str, Any]]]] = [[]]
    for i, end in enumerate(ends):
        a = 0 if i == 0 else ends[i - 1]
        options = [first] if (i == 0 and first is not None) else cands
        scored = []
        for prefix in beams:
            for cfg in options:
                rest = [*prefix, (a, bud.total_steps, cfg)]
                scored.append((schedule_score_noise_free(rest, sc, bud.total_steps), [*prefix, (a, end, cfg)]))
        scored.sort(key=lambda z: -z[0])
        # only schedules that run count: the best ranked prefixes whose continuation to T fits in memory (an
        # OOM'd segment leaves no checkpoint: any method that played this schedule would score nothing)
        kept: list[list[tuple[int, int, dict[str, Any]]]] = []
        for _, segs in scored:
            fits = segs if not memory else _runs(segs, sc, bud, safe_knobs)
            if fits is not None:
                kept.append(fits)
                if len(kept) == beam:
                    break
        if not kept:
            raise ValueError(f"no schedule of the oracle's grid runs to step {bud.total_steps} on {sc.name}")
        beams = kept
    best = beams[0]
    return schedule_score_noise_free(best, sc, bud.total_steps), best


#: how many times the oracle may halve the micro batches of a segment that would not fit (mart's stage 3
#: halves them once per transition, ``nodes.agents.schedule.memory_safe``, so a path of S segments up to S - 1)
ORACLE_HALVINGS = 3


def _runs(segs: list[tuple[int, int, dict[str, Any]]], sc: Any, bud: ScheduleBudget, safe_knobs: list[Any]
          ) -> list[tuple[int, int, dict[str, Any]]] | None:
    """``segs`` (a prefix whose last config runs on to T) if it runs to T, else the same with its last segment's
    micro batches (``ParamSpec.memory_safe``: the math unchanged, so the score too) halved as often as it takes
    (at most ``ORACLE_HALVINGS``), else None: the moves mart's stage 3 may make for memory, the oracle may too."""
    from mart.trial_runner.sim import model

    a, end, cfg = segs[-1]
    for _ in range(ORACLE_HALVINGS + 1):
        if model.schedule_oom([*segs[:-1], (a, bud.total_steps, cfg)], sc, bud.total_steps) is None:
            return [*segs[:-1], (a, end, cfg)]
        smaller = {p.key: max(int(p.low or 1), int(cfg.get(p.key, p.default)) // 2) for p in safe_knobs
                   if isinstance(cfg.get(p.key, p.default), int) and cfg.get(p.key, p.default) > (p.low or 1)}
        if not smaller:
            return None
        cfg = {**cfg, **smaller}
    return None


def _moves(prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, str]:
    """knob -> ``up``/``down``/``on``/``off``/new value: what changes between two consecutive segments' configs."""
    out = {}
    for k in sorted(set(prev) | set(cur)):
        a, b = prev.get(k), cur.get(k)
        if a == b:
            continue
        if isinstance(b, bool) or isinstance(a, bool):
            out[k] = "on" if b else "off"
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[k] = "up" if b > a else "down"
        else:
            out[k] = f"-> {b}"
    return out


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def diagnose_run(run: dict[str, Any], oracle_segs: list[dict[str, Any]], start: dict[str, Any], sc: Any,
                 bud: ScheduleBudget, base: dict[str, Any]) -> dict[str, Any]:
    """Where a mart run stands against the oracle's best schedule from the same start, boundary by boundary:
    for each knob move the oracle makes there, whether mart's tree ever moved that knob that way at that
    checkpoint (``not proposed``), and if it did, what became of the branch: ``taken`` (on the winning path),
    ``lost to noise`` (its noise-free value, continued unchanged to T, beats the node mart carried on from that
    boundary, but it measured lower), ``worse`` (the branch as proposed - with its other moves - is worth less
    noise-free than the node carried on), ``kept out by the evidence rule`` (it reached T and led by measured
    score, but the static schedule was kept), or ``pruned`` (it measured at least as well and was not carried
    on). Noise-free values from ``schedule_score_noise_free``."""
    from mart.trial_runner.sim.learning import schedule_score_noise_free

    sched = (run.get("extra") or {}).get("summary_schedule") or {}
    tree = sched.get("tree") or []
    by_id = {t["trial_id"]: t for t in tree}
    total = bud.total_steps

    def path(tid: str) -> list[dict[str, Any]]:
        out = []
        while tid:
            t = by_id.get(tid)
            if t is None:
                break
            out.append(t)
            tid = t.get("parent")
        return out[::-1]

    def config(tid: str) -> dict[str, Any]:
        cfg = dict(start)
        for t in path(tid):
            cfg.update(t.get("changes") or {})
        return cfg

    def value(tid: str) -> float:
        segs = [(t["from_step"], t["to_step"], config(t["trial_id"])) for t in path(tid)]
        a, _, c = segs[-1]
        return schedule_score_noise_free([*segs[:-1], (a, total, c)], sc, total)

    winner = sched.get("winner")
    win_path = {t["trial_id"] for t in path(winner)} if winner else set()
    leaves = [t for t in tree if t["to_step"] == total and t.get("score") is not None and not t.get("confirms")]
    best_leaf = max(leaves, key=lambda t: t["score"])["trial_id"] if leaves else None
    best_path = {t["trial_id"] for t in path(best_leaf)} if best_leaf else set()
    rows = []
    ends = [s["to_step"] for s in oracle_segs]
    for i in range(1, len(oracle_segs)):
        b = ends[i - 1]
        prev = {**base, **oracle_segs[i - 1]["overrides"]}
        cur = {**base, **oracle_segs[i]["overrides"]}
        here = [t for t in tree if t["from_step"] == b and not t.get("confirms") and t.get("changes")]
        carried = [t for t in tree if t["from_step"] == b and not t.get("confirms")
                   and any(c.get("parent") == t["trial_id"] for c in tree)]
        ref = next((t for t in carried if t["trial_id"] in win_path), carried[0] if carried else None)
        for knob, how in _moves(prev, cur).items():
            props = []
            for t in here:
                parent = config(t["parent"])
                mv = _moves({knob: parent.get(knob)}, {knob: config(t["trial_id"]).get(knob)})
                if mv.get(knob) == how:
                    props.append(t)
            if not props:
                verdict = "not proposed"
            elif any(t["trial_id"] in win_path for t in props):
                verdict = "taken"
            else:
                t = max(props, key=lambda t: value(t["trial_id"]))
                v, meas = value(t["trial_id"]), t.get("score")
                if t["trial_id"] in best_path:
                    verdict = "kept out by the evidence rule"
                elif ref is None or meas is None:
                    verdict = "pruned"
                elif v < value(ref["trial_id"]):
                    verdict = "worse"
                elif meas < (ref.get("score") or -1):
                    verdict = "lost to noise"
                else:
                    verdict = "pruned"
            rows.append({"step": b, "knob": _short(knob), "oracle": how,
                         "mart": [f"{t['trial_id']}: {', '.join(f'{_short(k)} {v}' for k, v in (t.get('changes') or {}).items())}"
                                  for t in props], "verdict": verdict})
    proposed = [{"step": t["from_step"], "id": t["trial_id"], "score": t.get("score"),
                 "noise_free": round(value(t["trial_id"]), 4),
                 "moves": {_short(k): v for k, v in _moves(config(t["parent"]), config(t["trial_id"])).items()}}
                for t in tree if t.get("parent") and not t.get("confirms") and t.get("changes")]
    oracle_moves = [{"step": ends[i - 1], "moves": {_short(k): v for k, v in _moves(
        {**base, **oracle_segs[i - 1]["overrides"]}, {**base, **oracle_segs[i]["overrides"]}).items()}}
        for i in range(1, len(oracle_segs))]
    return {"scenario": run["scenario"], "seed": run["seed"], "oracle_moves": oracle_moves, "winner_changes": [
        {_short(k): v for k, v in (s.get("overrides") or {}).items()} for s in run.get("segments") or []],
        "moves": rows, "proposed": proposed, "winner_is_static": bool(winner) and all(
            not by_id[t]["changes"] for t in win_path if t in by_id)}


def render_diagnosis(diags: list[dict[str, Any]], refs: dict[str, dict[str, Any]]) -> str:
    lines = ["# Where mart's schedule search stands against the oracle's (per scenario and seed)", ""]
    for sc in sorted({d["scenario"] for d in diags}):
        first = next(d for d in diags if d["scenario"] == sc)
        ref = refs.get(sc, {})
        lines.append(f"## {sc}")
        if ref.get("oracle_schedule_from_defaults") is not None:
            lines.append(f"Oracle from the start {ref['oracle_schedule_from_defaults']:.4f} vs the static path "
                         f"{ref['default']:.4f} ({100 * (ref['oracle_schedule_from_defaults'] / ref['default'] - 1):+.1f}%).")
        for m in first["oracle_moves"]:
            lines.append(f"- oracle at step {m['step']}: " + (", ".join(f"{k} {v}" for k, v in m["moves"].items()) or "unchanged"))
        lines += ["", "| seed | step | knob | oracle | verdict | mart's branches that made the move |", "|---|---|---|---|---|---|"]
        for d in sorted((d for d in diags if d["scenario"] == sc), key=lambda d: d["seed"]):
            for r in d["moves"]:
                lines.append(f"| {d['seed']} | {r['step']} | {r['knob']} | {r['oracle']} | {r['verdict']} | "
                             f"{'; '.join(r['mart'])[:120]} |")
            lines.append(f"| {d['seed']} | | winner | | {'static' if d['winner_is_static'] else 'schedule'} | "
                         f"{' / '.join(', '.join(f'{k} {v}' for k, v in w.items()) or '-' for w in d['winner_changes'])[:160]} |")
        lines.append("")
        lines.append("mart's transitions (step: moves -> measured / noise-free continued to T):")
        for d in sorted((d for d in diags if d["scenario"] == sc), key=lambda d: d["seed"]):
            lines.append(f"- seed {d['seed']}: " + "; ".join(
                f"{p['step']}: {', '.join(f'{k} {v}' for k, v in p['moves'].items())} -> "
                f"{'—' if p['score'] is None else format(p['score'], '.4f')} / {p['noise_free']:.4f}" for p in d["proposed"]))
        lines.append("")
    from collections import Counter

    tally = Counter(r["verdict"] for d in diags for r in d["moves"])
    lines.append("Verdicts over all oracle moves: " + ", ".join(f"{k} {v}" for k, v in tally.most_common()))
    return "\n".join(lines) + "\n"


def references(scenario: str, scenario_file: str | None, perturb: int | None, bud: ScheduleBudget,
               oracle: bool = False) -> dict[str, Any]:
    from bench.compare import sim_scenario
    from mart.trial_runner.sim.model import base_config, ground_truth_learning

    sc = sim_scenario(scenario, scenario_file, perturb)
    gt = ground_truth_learning(sc, bud.total_steps)
    out: dict[str, Any] = {"default": gt["baseline_score"], "static_optimum": gt["score"],
                           "static_optimum_overrides": gt["overrides"], "family": sc.model.name}
    if oracle:
        base = base_config(sc)
        for name, first in (("oracle_schedule", None), ("oracle_schedule_from_defaults", base)):
            score, segs = oracle_schedule(sc, bud, first)
            out[name] = score
            out[name + "_segments"] = [{"from_step": a, "to_step": b,
                                        "overrides": {k: v for k, v in c.items() if base.get(k) != v}}
                                       for a, b, c in segs]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SCENARIOS} x 3 seeds")
    p.add_argument("--scenarios", nargs="+", default=None, help=f"shipped sim scenarios (default: all {len(SCENARIOS)})")
    p.add_argument("--scenario-file", action="append", default=[], help="a scenario YAML (repeatable)")
    p.add_argument("--perturb", type=int, default=None, help="redraw the simulator's hidden constants (model mismatch)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per scenario (default 5; 3 with --quick)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"of {METHODS} (pb2 falls back to pbt when GPy/scikit-learn are missing); grid and grid-eq "
                        "always run: the gains' references")
    p.add_argument("--steps", type=int, default=ScheduleBudget.total_steps, help="total training steps T")
    p.add_argument("--segments", type=int, default=ScheduleBudget.segments)
    p.add_argument("--branches", type=int, default=ScheduleBudget.branches)
    p.add_argument("--budget", type=int, default=None, help="segment-trials for mart and random (default S x K)")
    p.add_argument("--start", choices=sorted(START_TEXT), default="defaults",
                   help="the config mart's and random's schedules start from (default: verl's defaults)")
    p.add_argument("--oracle", action="store_true",
                   help="also a noise-free beam search over schedules (a reference: how much a schedule can gain "
                        "over a static config on this simulator; ~20 s per scenario)")
    p.add_argument("--diagnose", action="store_true",
                   help="(implies --oracle) per scenario and seed: the oracle's best schedule's moves at each boundary "
                        "against what mart's tree proposed there, and what became of those branches")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the JSON verdict as the last line of stdout")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import concurrent.futures as cf

    from bench.compare import check_perturb_supported, sim_scenario

    args = parse_args(argv)
    args.oracle = args.oracle or args.diagnose
    if args.perturb is not None:
        check_perturb_supported()
    bud = ScheduleBudget(args.steps, args.segments, args.branches, args.budget)
    bud.boundaries()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown method(s) {sorted(unknown)}; choose from {METHODS}")
    for ref in (REFERENCE, "grid"):  # the references of every gain
        if ref not in methods:
            methods.insert(0, ref)
    if "mart" in methods and (why := mart_schedule_available()):
        print(f"[schedules] skipping mart: {why}", file=sys.stderr)
        methods.remove("mart")
    scenarios = args.scenarios or ([] if args.scenario_file else (QUICK_SCENARIOS if args.quick else SCENARIOS))
    files: dict[str, str | None] = {sc: None for sc in scenarios}
    for f in args.scenario_file:
        files[sim_scenario("", f).name] = str(Path(f).resolve())
    seeds = list(range(args.seeds if args.seeds is not None else (3 if args.quick else 5)))
    tasks = [{"scenario": sc, "scenario_file": path, "perturb": args.perturb, "seed": s, "method": m,
              "budget": asdict(bud)} for sc, path in files.items() for s in seeds for m in methods]
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []

    def done(run: dict[str, Any]) -> None:
        runs.append(run)
        err = f" ERROR {run['error']}" if run.get("error") else ""
        nf = "—" if run.get("noise_free") is None else f"{run['noise_free']:.4f}"
        print(f"[schedules] {run['scenario']} seed {run['seed']} {run['method']}: {run['segment_trials']} "
              f"segment-trials, noise-free {nf}, {run['wall_s']:.1f}s{err}", file=sys.stderr, flush=True)

    def run_all(batch: list[dict[str, Any]]) -> None:
        if args.jobs <= 1:
            for t in batch:
                done(run_task(t))
        else:
            with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
                for fut in cf.as_completed([pool.submit(run_task, t) for t in batch]):
                    done(fut.result())

    # the grid first: with --start grid, mart and random start from its pick of the same seed
    statics = ("grid", REFERENCE)  # static references from the base config, whatever --start says
    run_all([t for t in tasks if t["method"] in statics])
    if args.start == "grid":
        picks = {(r["scenario"], r["seed"]): (r["segments"][0]["overrides"] if r["segments"] else {})
                 for r in runs if r["method"] == "grid"}
        for t in tasks:
            if t["method"] not in statics:
                t["start"] = picks.get((t["scenario"], t["seed"]), {})
    run_all([t for t in tasks if t["method"] not in statics])
    refs = {sc: references(sc, path, args.perturb, bud, args.oracle) for sc, path in files.items()}
    report = build_report(runs, bud, refs, methods, args.start)
    if args.diagnose and "mart" in methods:
        diags = []
        for r in runs:
            if r["method"] != "mart" or r.get("error"):
                continue
            where = (r["scenario"], files.get(r["scenario"]), args.perturb)
            sc = sim_scenario(*where)
            start = {**base_of(*where), **((r.get("extra") or {}).get("start") or {})}
            diags.append(diagnose_run(r, refs[r["scenario"]].get("oracle_schedule_from_defaults_segments") or [],
                                      start, sc, bud, base_of(*where)))
        report["diagnosis"] = diags
        print(render_diagnosis(diags, refs), file=sys.stderr if args.json else sys.stdout)
    report["wall_s"] = time.monotonic() - t0
    out = Path(args.out) / time.strftime("schedules-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    table = render(report, methods) + f"\nWall time: {report['wall_s']:.0f} s with {max(1, args.jobs)} worker(s).\n"
    verdict = {"schedule": report}
    (out / "table.md").write_text(table)
    (out / "raw.json").write_text(json.dumps({"report": report, "runs": runs}, indent=1, default=str))
    (out / "verdict.json").write_text(json.dumps(verdict, indent=1, default=str))
    print(table, file=sys.stderr if args.json else sys.stdout)
    print(f"[schedules] results in {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(verdict, default=str), flush=True)
    return verdict


if __name__ == "__main__":
    main()
