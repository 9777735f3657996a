"""Does a cheap fit probe pay? Stage 1 with and without one, on the simulator, at equal GPU-hours.

A stage-1 trial's measured peak is the largest phase's, and with the rollout's memory share solved up to the
limit that is usually the rollout: the training phases' memory stays hidden, so the job model keeps its
conservative prior on activations and logits and forgoes the larger micro batches. A *fit probe* (what
AReaL's ``--tune-params`` and SkyRL's auto micro batch run with dummy weights) measures each training phase's
peak at a few shapes in one short run: start-up plus a few micro batches per shape, no rollout, no full step.

This script runs the job model's stage-1 loop outside the graph - the same calibration (``JobModel.fit``), the
same search (``model_search.search``) and the critic's ranking (predicted gain discounted by the chance of
crossing the limit), every trial simulated with noise - twice per scenario and seed: without a probe, and with
one probe after the baseline (two shapes: dynamic bsz at a 32k token cap with gradient checkpointing, 16k
without; each phase's peak read from the simulator's per-phase memory, as a probe's own measurement would be).
The probe is charged its start-up and a quarter of one step's training passes per shape, in GPU-hours, like any
trial. Reported: best-so-far (% of the simulator's optimum) at trials 4 and 8 and at equal GPU-hours,
OOM/over-margin trials.

    python bench/fit_probe.py                      # shipped + example scenarios, 2 seeds
    python bench/fit_probe.py --scenarios qwen3-8b-1x8 examples/scenarios/qwen2.5-32b-4x8-h100.yaml --seeds 3
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mart.nodes.agents.job_model import JobModel, Observation, observation_from_records  # noqa: E402
from mart.nodes.agents.model_search import search  # noqa: E402
from mart.state.metrics import StepRecord  # noqa: E402
from mart.state.models import config_hash  # noqa: E402
from mart.state.objectives import system_outcome, throughput_window  # noqa: E402
from mart.trial_runner.sim import load_scenario  # noqa: E402
from mart.trial_runner.sim import model as sim  # noqa: E402
from mart.trial_runner.sim.backend import SimBackend  # noqa: E402

A, M = "actor_rollout_ref.actor.", "actor_rollout_ref.model."
TRAIN_PHASES = ("old_log_prob", "ref", "update_actor")
#: share of one step's training passes a probe of one shape costs (a few micro batches of each pass)
PROBE_SHARE = 0.25


def probe_shapes(sc) -> list[dict[str, Any]]:
    seq = sc.max_prompt_length + sc.max_response_length
    return [{A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": max(32768, seq),
             M + "enable_gradient_checkpointing": True},
            {A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": max(16384, seq),
             M + "enable_gradient_checkpointing": False}]


def fit_probe(sc, base: dict[str, Any], seed: int) -> tuple[list[Observation], float]:
    """Per-phase peaks of the training passes at each probe shape, and the probe's GPU-hours."""
    obs, gpu_h = [], 0.0
    for j, shape in enumerate(probe_shapes(sc)):
        cfg = {**base, **shape, "trainer.val_before_train": False, "trainer.test_freq": -1}
        res = sim.simulate(cfg, sc, 1, seed=seed * 1000 + 500 + j)
        if j == 0:
            gpu_h += res.init_s * sc.n_gpus / 3600
        if not res.events:  # out of memory at this shape: the peak reached the capacity
            obs.append(Observation(config=cfg, phases={}, peak_gb=None, oom=True))
            continue
        d = res.events[-1].data
        peaks = {p: d[f"sim/memory/{p}_gb"] for p in TRAIN_PHASES if f"sim/memory/{p}_gb" in d}
        gpu_h += PROBE_SHARE * sum(d.get(f"timing_s/{p}", 0.0) for p in TRAIN_PHASES) * sc.n_gpus / 3600
        obs.append(Observation(config=cfg, phases={}, peak_gb=None, phase_peaks=peaks))
    return obs, gpu_h


def session(spec: str, perturb: int | None, seed: int, trials: int, probe: bool, n_candidates: int = 3
            ) -> dict[str, Any]:
    sc = load_scenario(spec, perturb)
    as_file = spec.endswith((".yaml", ".yml"))
    backend = SimBackend(scenario=None if as_file else spec, scenario_file=spec if as_file else None,
                         perturb=perturb, seed=seed)
    space, base, job = backend.search_space(), sim.base_config(sc), backend.describe_job()
    gt = sim.ground_truth(sc, 0.1, 6)
    limit = 0.9 * sc.gpu.memory_gb
    window = throughput_window(6)
    obs: list[Observation] = []
    tried: set[str] = set()
    best: tuple[dict[str, Any], float] | None = None
    curve, spent, bad = [], [], 0
    gpu_h = 0.0
    for i in range(trials):
        pred = None
        over: dict[str, Any] = {}
        if i == 1 and probe:
            extra, cost = fit_probe(sc, base, seed)
            obs += extra
            gpu_h += cost
        if i > 0:
            jm = JobModel(job, base).fit(obs)
            inc = best[0] if best else {}
            found = search(jm, space, base, limit, incumbent=inc, tried=tried,
                           check=lambda o: space.check_constraints({**base, **o}), n_out=4 * n_candidates)
            if not found:
                break
            inc_thr = jm.predict({**base, **inc}).throughput

            def critic_score(s):  # the rules critic's ranking: predicted gain x (1 - 1.5 P(over the limit))
                p = jm.predict({**base, **s.overrides})
                sigma = max(p.gap_gb / 2, 1e-6)
                p_over = 0.5 * math.erfc((limit - p.peak_gb) / (sigma * math.sqrt(2)))
                return p.throughput / inc_thr * (1 - 1.5 * p_over), p

            (_, pred), pick = max(((critic_score(s), s) for s in found[:n_candidates]), key=lambda t: t[0][0])
            over = pick.overrides
        cfg = {**base, **over}
        tried.add(config_hash(cfg))
        res = sim.simulate(cfg, sc, 6, seed=seed * 1000 + i)
        records = [StepRecord(e.step, dict(e.data)) for e in res.events]
        out = system_outcome(records, 6, limit)
        peak = None if math.isnan(out.peak_memory_gb) else out.peak_memory_gb
        thr = out.throughput if res.status == "completed" and not math.isnan(out.throughput) else None
        obs.append(observation_from_records(cfg, records, peak_gb=peak, oom=res.status == "oom", throughput=thr,
                                            window=window, predicted_peak_gb=pred.peak_gb if pred else None,
                                            predicted_throughput=pred.throughput if pred else None))
        feasible = thr is not None and (peak is None or peak <= limit)
        bad += i > 0 and not feasible
        if feasible and (best is None or thr > best[1]):
            best = (over, thr)
        gpu_h += res.gpu_hours
        curve.append(100 * best[1] / gt["throughput"] if best else 0.0)
        spent.append(gpu_h)
    return {"scenario": sc.name, "seed": seed, "probe": probe, "curve": curve, "gpu_hours": spent, "bad": bad}


def at_gpu_hours(run: dict[str, Any], g: float) -> float:
    best = 0.0
    for pct, spent in zip(run["curve"], run["gpu_hours"]):
        if spent > g * (1 + 1e-9):
            break
        best = pct
    return best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", nargs="+", default=None,
                   help="shipped names or scenario files (default: the 4 shipped + examples/scenarios/*.yaml)")
    p.add_argument("--perturb", type=int, default=None)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--trials", type=int, default=12)
    args = p.parse_args(argv)
    specs = args.scenarios or (["qwen3-8b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-1x8", "qwen3-0.6b-2x8"]
                               + sorted(str(f) for f in (ROOT / "examples" / "scenarios").glob("*.yaml")))
    rows = []
    for spec in specs:
        for seed in range(args.seeds):
            plain = session(spec, args.perturb, seed, args.trials, probe=False)
            probed = session(spec, args.perturb, seed, args.trials, probe=True)
            g = min(plain["gpu_hours"][-1], probed["gpu_hours"][-1])
            row = {"scenario": plain["scenario"], "seed": seed,
                   **{f"{k}_{tag}": v for tag, r in (("plain", plain), ("probe", probed))
                      for k, v in (("t4", r["curve"][min(3, len(r["curve"]) - 1)]),
                                   ("t8", r["curve"][min(7, len(r["curve"]) - 1)]),
                                   ("at_equal_gpu_h", at_gpu_hours(r, g)), ("bad", r["bad"]),
                                   ("gpu_h", r["gpu_hours"][-1]))}}
            rows.append(row)
            print(f"{row['scenario']:34s} s={seed}: no probe t4 {row['t4_plain']:5.1f} t8 {row['t8_plain']:5.1f} "
                  f"@{g:.0f} GPU-h {row['at_equal_gpu_h_plain']:5.1f} bad {row['bad_plain']} | probe t4 "
                  f"{row['t4_probe']:5.1f} t8 {row['t8_probe']:5.1f} @{g:.0f} GPU-h {row['at_equal_gpu_h_probe']:5.1f} "
                  f"bad {row['bad_probe']}", flush=True)
    summary = {}
    for tag in ("plain", "probe"):
        summary[tag] = {
            "t8_median": statistics.median(r[f"t8_{tag}"] for r in rows),
            "t8_ge_97": sum(r[f"t8_{tag}"] >= 97 for r in rows),
            "t4_ge_95": sum(r[f"t4_{tag}"] >= 95 for r in rows),
            "equal_gpu_h_median": statistics.median(r[f"at_equal_gpu_h_{tag}"] for r in rows),
            "sessions_le_1_bad": sum(r[f"bad_{tag}"] <= 1 for r in rows), "pairs": len(rows)}
    wins = sum(r["at_equal_gpu_h_probe"] > r["at_equal_gpu_h_plain"] + 0.5 for r in rows)
    losses = sum(r["at_equal_gpu_h_probe"] < r["at_equal_gpu_h_plain"] - 0.5 for r in rows)
    summary["probe_better_at_equal_gpu_h"], summary["probe_worse_at_equal_gpu_h"] = wins, losses
    print(json.dumps(summary, indent=1))
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":
    main()
