"""bench/compare.py: a tiny end-to-end comparison with its JSON verdict, the counts on a hand-made run, the
shared repair of drawn configs, and a method that cannot draw a valid candidate."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO as REPO_ROOT

ROOT = REPO_ROOT
SCENARIO = "qwen3-0.6b-1x8"
BASELINES = ["default", "fit-largest", "random", "grid", "tpe", "tpe-restricted", "cmaes", "cmaes-restricted"]


@pytest.fixture(scope="module")
def compare():
    sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(ROOT))


def trial(stage: str, seq: int, **kw) -> dict:
    base = {"stage": stage, "seq": seq, "overrides": {}, "status": "completed", "throughput": None, "peak_memory_gb": None,
            "feasible": True, "score": None, "early_stopped": False, "gpu_hours": 1.0, "planned_gpu_hours": 1.0,
            "steps_done": 6, "reason": None}
    return {**base, **kw}


def test_summarize_counts_every_trial_once(compare) -> None:
    run = {"trials": [
        trial("system", 1, throughput=80.0, peak_memory_gb=50.0),
        trial("system", 2, status="oom", feasible=False),
        trial("system", 3, throughput=99.0, peak_memory_gb=75.0, feasible=False),  # completed over the margin
        # stopped by mart's health monitor for the margin: over-margin, not hidden
        trial("system", 4, status="stopped", feasible=False, peak_memory_gb=74.0, early_stopped=True,
              reason="health: memory_margin: peak memory 74 GB above the margin limit 72 GB"),
        trial("system", 5, throughput=96.0, peak_memory_gb=60.0),
        trial("system", 6, status="failed", feasible=False),
        trial("learning", 7, score=0.4),
        trial("learning", 8, score=0.1, status="stopped", early_stopped=True, feasible=False, gpu_hours=0.25),
    ], "noise_free": {"throughput": 90.0, "score": 0.30, "default_score": 0.35}}
    s = compare.summarize(run, 100.0, compare.Budget(), limit_gb=72.0)
    assert s["trials"] == 8 and s["oom"] == 1 and s["over_margin"] == 2 and s["failed"] == 1 and s["stopped"] == 1
    assert s["best_throughput"] == 96.0 and s["pct_of_optimum"] == pytest.approx(96.0)
    assert s["trials_to_95"] == 5 and s["learning_score"] == 0.4 and s["early_stopped"] == 2
    assert s["curve"] == [80.0, 80.0, 80.0, 80.0, 96.0, 96.0]
    assert s["chosen_pct_noise_free"] == pytest.approx(90.0)
    assert s["stage2_regression"] is True  # the pick is worse than the defaults in expectation
    assert s["gpu_hours"] == pytest.approx(7.25) and s["gpu_hours_saved"] == pytest.approx(0.75)


def test_over_margin_stop_without_limit_is_still_counted(compare) -> None:
    t = trial("system", 1, status="stopped", feasible=False, reason="health: memory_margin: peak above the limit")
    assert compare.over_margin(t, None)
    assert not compare.over_margin(trial("system", 2, status="stopped", reason="health: nan: NaN loss"), None)


def test_repair_makes_draws_valid_for_every_method(compare) -> None:
    """Uniform draws of the full catalogue almost never pass verl's constraints; the shared repair fixes most."""
    from bench.baselines.space import random_overrides, repair, valid
    from mart.trial_runner.sim import model

    space, base = model.search_space(), model.base_config(SCENARIO)
    rng = random.Random(0)
    for stage in ("system", "learning"):
        draws = [random_overrides(space, stage, base, rng) for _ in range(200)]
        raw_ok = sum(valid(space, base, d) for d in draws)
        fixed = [repair(space, base, d) for d in draws]
        assert sum(valid(space, base, f) for f in fixed) >= 0.9 * len(draws) > raw_ok
        # repair moves only knobs of the draw, and keeps them inside the catalogue's ranges
        for f in fixed:
            assert set(f) == set(draws[0]) and space.validate_overrides(f, stage=stage)


def test_focus_space_is_narrower_and_keeps_the_defaults() -> None:
    from mart.trial_runner.sim import model
    from mart.trial_runner.verl.focus import FOCUS, focus_space

    full = model.search_space()
    focus = focus_space(full)
    assert {p.key for p in focus.params} == set(FOCUS) and len(focus.params) < len(full.params)
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    assert focus[micro].high < full[micro].high
    for p in focus.params:
        if p.low is not None:
            assert p.low <= p.default <= p.high, p.key


def test_quick_json_verdict_has_every_baseline(compare, tmp_path: Path, capsys) -> None:
    methods = list(BASELINES)
    if compare.mart_available() is None:
        methods.insert(0, "mart")
    report = compare.main([
        "--scenarios", SCENARIO, "--seeds", "1", "--methods", ",".join(methods), "--system-trials", "4",
        "--learning-trials", "2", "--learning-horizon", "6", "--jobs", "1", "--out", str(tmp_path), "--json",
    ])
    stdout = capsys.readouterr().out
    verdict = json.loads(stdout.strip().splitlines()[-1])  # the last line of stdout is the verdict
    assert set(verdict) == {"scenarios", "runs"}
    sc = verdict["scenarios"][SCENARIO]
    assert sc["optimum"] > 0 and isinstance(sc["optimum_config"], dict) and sc["optimum_config"]
    assert {r["method"] for r in verdict["runs"]} == set(methods)
    for r in verdict["runs"]:
        for key in ("scenario", "seed", "method", "best_so_far_pct", "chosen_noise_free_pct", "trials", "oom",
                    "over_margin", "failed", "stage2_chosen_noise_free", "stage2_default_noise_free"):
            assert key in r, key
        assert r["scenario"] == SCENARIO and r["seed"] == 0 and r["error"] is None, r
        assert len(r["best_so_far_pct"]) <= 4 and r["trials"] >= 2
        assert all(p is None or p < 105 for p in r["best_so_far_pct"])  # nobody beats the exhaustive optimum
        assert 0 < r["chosen_noise_free_pct"] <= 100.5
        assert r["oom"] + r["over_margin"] + r["failed"] <= r["trials"]
        assert r["stage2_chosen_noise_free"] is not None and r["stage2_default_noise_free"] is not None
        if r["method"] != "default":
            assert r["trials"] > 2 and not r["no_valid_candidate"], r  # each variant produced candidates
        else:
            assert r["trials"] == 2
    # every config a baseline ran passes verl's constraints (nothing invalid launched)
    from mart.trial_runner.sim import model

    space, base = model.search_space(), model.base_config(SCENARIO)
    for run in report["runs"]:
        if run["method"] == "mart":
            continue
        for t in run["trials"]:
            stage_base = base if t["stage"] == "system" else {**base, **run["best_system"]}
            assert not space.check_constraints({**stage_base, **t["overrides"]}), (run["method"], t["overrides"])
    out = Path(report["out_dir"])
    table = (out / "table.md").read_text()
    assert (out / "best_so_far.png").stat().st_size > 1000
    assert json.loads((out / "verdict.json").read_text()) == verdict
    for m in methods:
        assert f"| {m} |" in table, table
    assert "Simulator optimum" in table and "Optimum's config" in table


class _NoLearningRoom:
    """A sim backend whose catalogue only admits the default learning rate: no stage-2 draw can be valid."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def search_space(self):
        from mart.state.search_space import Constraint, SearchSpace

        space = self.inner.search_space()
        lr = "actor_rollout_ref.actor.optim.lr"
        only_default = Constraint("lr_pinned", "lr stays at its default",
                                  lambda c: None if c.get(lr, 1e-6) == 1e-6 else "lr must stay 1e-6")
        return SearchSpace(space.backend, list(space.params), [*space.constraints, only_default])


@pytest.mark.parametrize("method", ["random", "tpe-restricted", "cmaes"])
def test_method_without_valid_candidates_says_so(compare, tmp_path: Path, method: str) -> None:
    from bench.baselines import Budget, run_method
    from bench.baselines.space import REDRAWS

    backend = _NoLearningRoom(compare.make_backend("sim", SCENARIO, 0))
    res = run_method(method, backend, scenario=SCENARIO, seed=0, budget=Budget(system_trials=2, learning_trials=3,
                                                                             learning_horizon=6), workdir=tmp_path)
    assert res.error is None
    assert res.extra["no_valid_candidate"] == {"learning": 2}  # trial 2 of stage 2: nothing valid to run
    assert res.extra["invalid_draws"]["learning"] + res.extra["duplicate_draws"]["learning"] == REDRAWS
    learning = [t for t in res.trials if t.stage == "learning"]
    assert len(learning) == 1 and learning[0].overrides.get("actor_rollout_ref.actor.optim.lr", 1e-6) == 1e-6
    run = {**res.to_dict(), "noise_free": None}
    s = compare.summarize(run, 100.0, Budget())
    rep = {"workload": "sim", "budget": Budget().__dict__, "seeds": [0], "runs": [run],
           "scenarios": {SCENARIO: {"methods": {method: [{**s, "seed": 0}]}}}}
    table = compare.render_table(rep)
    assert f"| {method} ✗ |" in table and "learning trial 2" in table
    assert compare.verdict(rep)["runs"][0]["no_valid_candidate"] == {"learning": 2}


def test_scenario_file_and_perturb_reach_the_simulator(compare, tmp_path: Path, capsys) -> None:
    from mart.trial_runner import sim

    files = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))
    if not hasattr(sim, "load_scenario") or not files:
        pytest.skip("this build has no sim scenario files")
    name = sim.load_scenario(str(files[0])).name
    verdicts = []
    for extra in ([], ["--perturb", "3"]):
        compare.main(["--scenario-file", str(files[0]), "--seeds", "1", "--methods", "default,tpe-restricted",
                      "--system-trials", "2", "--learning-trials", "1", "--learning-horizon", "6", "--jobs", "1",
                      "--out", str(tmp_path), "--json", *extra])
        verdicts.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    for v in verdicts:
        assert list(v["scenarios"]) == [name] and v["scenarios"][name]["optimum"] > 0
        assert {r["method"] for r in v["runs"]} == {"default", "tpe-restricted"}
        assert all(r["error"] is None and r["scenario"] == name for r in v["runs"])
    # the perturbed simulator has other hidden constants, so another optimum
    assert verdicts[0]["scenarios"][name]["optimum"] != verdicts[1]["scenarios"][name]["optimum"]


# the 8B on 8 H100s: a cap that runs but peaks over 0.9 of the card before one that fits (the margin rule, not only
# the OOM, decides); the 8B on 48 GB L40S cards: the cap above the one that fits runs out of memory. (The two swapped
# when the simulator's memory began to follow torch's accounting, issue 42.)
@pytest.mark.parametrize(("sc", "completed_over"), [
    ("qwen3-8b-1x8", True), (str(ROOT / "examples" / "scenarios" / "llama-3.1-8b-1x8-l40s.yaml"), False)])
def test_fit_largest_keeps_the_largest_shape_that_fits(compare, tmp_path: Path, sc: str, completed_over: bool) -> None:
    """AReaL/SkyRL's rule: probe token caps from the largest down, keep the first whose peak is within the margin,
    run it as a full trial. The oracle is the simulator's own noise-free peak of each probed shape."""
    from bench.baselines import Budget, run_method
    from mart.trial_runner.sim import model

    cap_key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    backend = compare.make_backend("sim", sc, 0)
    budget = Budget(system_trials=8, learning_trials=1, learning_horizon=6)
    res = run_method("fit-largest", backend, scenario=sc, seed=0, budget=budget, workdir=tmp_path)
    assert res.error is None
    limit = 0.9 * backend.memory_capacity_gb()
    system = [t for t in res.trials if t.stage == "system"]
    probes = [t for t in system if t.probe]
    caps = [t.overrides[cap_key] for t in probes]
    assert caps == sorted(caps, reverse=True) and caps[0] == 65536  # from the largest down, by halves
    base = model.base_config(sc)
    peak = {c: model.expected_throughput({**base, **FitShape(c)}, sc, 1)[1] for c in caps}
    fits = [c for c in caps if peak[c] <= limit - 0.5]  # clear of the measurement noise (0.15 GB)
    assert fits and len(fits) < len(caps), "the scenario must have shapes on both sides of the limit"
    chosen = res.best_system.get(cap_key)
    # the first (largest) probe that fitted is the pick; none clearly over the limit is
    assert chosen >= max(fits) and peak[chosen] <= limit + 0.5
    assert all(t.throughput is None and not t.feasible for t in probes)  # a probe is never picked
    final = [t for t in system if not t.probe and t.overrides]
    assert len(final) == 1 and final[0].overrides == {**FitShape(max(fits))}
    # a probe costs its start-up and training passes: less than a full 6-step trial of the same shape
    assert all(p.gpu_hours < final[0].gpu_hours for p in probes)
    # the probes over the margin are counted as such in the table
    s = compare.summarize({**res.to_dict(), "noise_free": None}, 100.0, budget, limit)
    assert s["over_margin"] + s["oom"] == sum(1 for t in probes if t.status == "oom" or (t.peak_memory_gb or 0) > limit)
    assert s["probes"] == len(probes)
    over = [t for t in probes if t.status == "completed" and t.peak_memory_gb > limit]
    assert bool(over) == completed_over and all(t.overrides[cap_key] > chosen for t in over)


def FitShape(cap: int) -> dict:
    return {"actor_rollout_ref.actor.use_dynamic_bsz": True, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": cap}


def test_equal_gpu_hours_reads_both_curves_at_the_smaller_spend(compare) -> None:
    # mart: 3 trials of 1 GPU-h each; the baseline: one cheap run then a big one
    mart = {"seed": 0, "gpu_curve": [(1.0, 50.0), (2.0, 80.0), (3.0, 90.0)]}
    cheap = {"seed": 0, "gpu_curve": [(0.5, 60.0), (1.6, 85.0)]}
    costly = {"seed": 0, "gpu_curve": [(2.5, 70.0), (6.0, 95.0)]}
    rep = {"methods": {"mart": [mart], "cheap": [cheap], "costly": [costly]}}
    pairs = compare.equal_gpu_pairs(rep)
    # at 1.6 GPU-h mart had only its first trial (50) against the cheap method's 85: mart loses that pair
    assert pairs["cheap"] == {"pairs": 1, "ref_at_least": 0, "median_gain_pct": pytest.approx(100 * (50 / 85 - 1)),
                              "lost_seeds": [0]}
    # at 3.0 GPU-h mart has 90, the costly method 70 (its 95 came after 6 GPU-h)
    assert pairs["costly"]["ref_at_least"] == 1 and pairs["costly"]["lost_seeds"] == []
    # the pair: one seed lost to any method is lost against every baseline at once
    assert compare.at_least_every_baseline(rep) == {0: False}
    rep["methods"]["cheap"] = [{"seed": 0, "gpu_curve": [(0.5, 40.0), (1.6, 45.0)]}]
    assert compare.at_least_every_baseline(rep) == {0: True}


def test_local_table_reads_remeasured_winners_per_seed_and_the_load(compare) -> None:
    from bench.baselines import Budget

    def row(method: str, seed: int, remeasured: list[float]) -> dict:
        run = {"method": method, "scenario": "local", "seed": seed, "trials": [trial("system", 1, throughput=100.0)],
               "extra": {"remeasured": remeasured, "loadavg": [1.5, 2.5]}, "noise_free": None}
        return run, {**compare.summarize(run, None, Budget()), "seed": seed}

    runs, methods = [], {"mart": [], "random": [], "tpe": []}
    # seed 0: mart 12 vs best other 11 (win); seed 1: 9 vs 10 (loss); seed 2: 10 vs 10 (a tie counts)
    for seed, (m, r, t) in enumerate([(12.0, 11.0, 8.0), (9.0, 10.0, 7.0), (10.0, 10.0, 9.0)]):
        for method, v in (("mart", m), ("random", r), ("tpe", t)):
            run, s = row(method, seed, [v, v])
            runs.append(run)
            methods[method].append(s)
    lines = compare.render_local_noise({"methods": methods}, runs, "local")
    text = "\n".join(lines)
    assert "better of random's and TPE's re-measured winners in 2 of 3 seeds" in text, text
    assert "Load average (1 min)" in text and "median 2.00 [1.50–2.50]" in text, text


def _capturing(cls):
    """The baseline ``cls`` keeping every (config run, outcome, the study's trial as told) for the test."""

    class Capturing(cls):
        told: list = []

        def tell(self, stage, overrides, outcome, pruned_ok=True):
            trial = self.current
            super().tell(stage, overrides, outcome, pruned_ok)
            if stage == "system" and trial is not None:
                Capturing.told.append((outcome, self.study.trials[trial.number]))

    return Capturing


@pytest.mark.parametrize(("method", "seed"), [("tpe", 2), ("cmaes", 1)])  # seeds with an OOM and an over-margin run
def test_optuna_baselines_see_oom_and_over_margin_as_infeasible(compare, tmp_path: Path, monkeypatch,
                                                                method: str, seed: int) -> None:
    """Constrained TPE (Optuna 5's ``Trial.set_constraint``, which replaced ``constraints_func``) is told each
    trial's margin violation: an OOM or a peak over 0.9 of the card is infeasible, a run within it feasible; a
    sampler without constraints (CMA-ES) is told 0 for an infeasible trial instead of its throughput."""
    from bench.baselines import Budget, methods, run_method

    cls = _capturing(methods.METHODS[method])
    monkeypatch.setitem(methods.METHODS, method, cls)
    sc = "qwen3-8b-1x8"
    backend = compare.make_backend("sim", sc, 0)
    limit = 0.9 * backend.memory_capacity_gb()
    res = run_method(method, backend, scenario=sc, seed=seed, budget=Budget(system_trials=8, learning_trials=0),
                     workdir=tmp_path)
    assert res.error is None
    told = cls.told
    assert len(told) >= len([t for t in res.trials if t.stage == "system"])
    # the oracle: the benchmark's own record of each run (its status and measured peak against the limit)
    bad = [o.status != "completed" or (o.peak_memory_gb is not None and o.peak_memory_gb > limit) for o, _ in told]
    assert not all(bad) and any(o.status == "oom" for o, _ in told)
    assert any(o.status == "completed" and b for (o, _), b in zip(told, bad)), "no completed run over the margin"
    for (o, ft), infeasible in zip(told, bad):
        assert ft.state.name == "COMPLETE"
        if method == "tpe":
            assert (max(ft.constraints.values()) > 0) == infeasible, (o.status, o.peak_memory_gb, ft.constraints)
            assert ft.value == (o.throughput if o.status == "completed" else 0.0)
        else:
            assert not ft.constraints
            assert ft.value == (0.0 if infeasible else o.throughput)
