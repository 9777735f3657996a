"""Benchmark of the embedded local GRPO workload (trial_runner/local): what `docs/backends.md` quotes.

    python bench/local_workload.py            # everything (~3-4 min on an idle 2-core box)
    python bench/local_workload.py --only 30  # the 30-step default trial only
    python bench/local_workload.py --only knobs|lr
    python bench/local_workload.py --only knobs --rounds 3   # steadier timings on a shared box

1. ``30``: a 30-step trial with the default config, as a process through the local runner (process start
   and the cached base model included): wall time, per-step time, validation score at step 0 and 30.
2. ``knobs``: a handful of system configs (micro-batch sizes, max_num_seqs, gradient checkpointing,
   dynamic batch size, max_response_length): throughput (median of steps 2..N) and peak memory.
3. ``lr``: the default config with lr x 100: the pathology in the metrics (reward, entropy, grad norm).

Trials run one after another (never in parallel), so their timings do not disturb each other; the box
may still be shared with other work, so timings are noisy. Results also go to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mart.state.models import TrialStatus
from mart.state.trials import TrialSpec
from mart.trial_runner.local.backend import LocalBackend
from mart.trial_runner.local.runner import LocalRunner
from mart.trial_runner.metrics import MetricsTail

VAL = "val-core/digit_sort/reward/mean@1"
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing"
FAST_LOGPROB = {R + "log_prob_micro_batch_size_per_gpu": 128, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 128}

KNOB_CONFIGS: list[tuple[str, dict]] = [
    ("default (micro 4, lp 8, seqs 16, ckpt)", {}),
    ("micro 1, lp 1, seqs 4", {A + "ppo_micro_batch_size_per_gpu": 1, R + "log_prob_micro_batch_size_per_gpu": 1,
                               "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1, R + "max_num_seqs": 4}),
    ("micro 16, ckpt", {A + "ppo_micro_batch_size_per_gpu": 16}),
    ("micro 64, ckpt", {A + "ppo_micro_batch_size_per_gpu": 64}),
    ("micro 16, no ckpt", {A + "ppo_micro_batch_size_per_gpu": 16, CKPT: False}),
    ("micro 32, no ckpt", {A + "ppo_micro_batch_size_per_gpu": 32, CKPT: False}),
    ("micro 64, no ckpt", {A + "ppo_micro_batch_size_per_gpu": 64, CKPT: False}),
    ("seqs 128, lp 128 (micro 4, ckpt)", {R + "max_num_seqs": 128, **FAST_LOGPROB}),
    ("micro 64, no ckpt, seqs 128, lp 128", {A + "ppo_micro_batch_size_per_gpu": 64, CKPT: False,
                                             R + "max_num_seqs": 128, **FAST_LOGPROB}),
    ("dynamic bsz 2048 tok, no ckpt, seqs 128", {A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": 2048,
                                                 CKPT: False, R + "max_num_seqs": 128}),
    ("micro 64, no ckpt, no rmpad, resp 16", {A + "ppo_micro_batch_size_per_gpu": 64, CKPT: False,
                                              "actor_rollout_ref.model.use_remove_padding": False}),
    ("micro 64, no ckpt, no rmpad, resp 32", {A + "ppo_micro_batch_size_per_gpu": 64, CKPT: False,
                                              "actor_rollout_ref.model.use_remove_padding": False,
                                              "data.max_response_length": 32}),
    ("micro 64, no ckpt, no rmpad, resp 48", {A + "ppo_micro_batch_size_per_gpu": 64, CKPT: False,
                                              "actor_rollout_ref.model.use_remove_padding": False,
                                              "data.max_response_length": 48}),
    ("default, resp 48", {"data.max_response_length": 48}),
]


def run(name: str, overrides: dict, steps: int, root: Path, capacity: float | None = None) -> tuple[float, list, str]:
    runner = LocalRunner(memory_capacity_gb=capacity)
    config = {**LocalBackend().base_config(), **overrides}
    spec = TrialSpec(trial_id=name, config=config, steps=steps, trial_dir=str(root / name.replace(" ", "_")))
    t0 = time.monotonic()
    handle = runner.launch(spec)
    while not (poll := runner.poll(handle)).status.is_finished():
        time.sleep(0.05)
    wall = time.monotonic() - t0
    if poll.status is not TrialStatus.COMPLETED:
        log = Path(handle.trial_dir, "trial.log").read_text()[-1500:]
        raise SystemExit(f"{name}: {poll.status.value} {poll.reason}\n{log}")
    return wall, MetricsTail(Path(handle.trial_dir) / "metrics.jsonl").read_new(), handle.trial_dir


def bench_30(root: Path) -> dict:
    run("warm the base-model cache", {"trainer.val_before_train": False, "trainer.test_freq": -1}, 1, root)
    wall, recs, _ = run("default 30 steps", {}, 30, root)
    step_s = [r.get("timing_s/step") for r in recs if r.step >= 1]
    vals = {r.step: r.get(VAL) for r in recs if VAL in r.data}
    lens = [r.get("response_length/mean") for r in recs if r.step >= 1]
    out = {"wall_s": wall, "median_step_s": statistics.median(step_s), "max_step_s": max(step_s),
           "val": vals, "val_gain": vals[30] - vals[0], "response_length_first3": statistics.mean(lens[:3]),
           "response_length_last3": statistics.mean(lens[-3:])}
    print("\n== 30-step trial, default config (process start + cached base model included) ==")
    print(f"wall time            {wall:6.1f} s   (budget 60 s)")
    print(f"step time            median {out['median_step_s']:.2f} s, max {out['max_step_s']:.2f} s")
    print("validation score     " + "  ".join(f"{s}:{v:.3f}" for s, v in vals.items()))
    print(f"gain step 0 -> 30    {out['val_gain']:+.3f}   (needs >= +0.10)")
    print(f"response length      {out['response_length_first3']:.2f} (steps 1-3) -> {out['response_length_last3']:.2f}"
          " (steps 28-30): the policy learns to stop")
    return out


def bench_knobs(root: Path, steps: int, rounds: int) -> list[dict]:
    print(f"\n== system knobs: {steps} steps each, {rounds} round(s) interleaved, one trial at a time; "
          f"throughput = median over steps 2..{steps} (and over rounds) ==")
    samples: dict[str, list[dict]] = {name: [] for name, _ in KNOB_CONFIGS}
    for i in range(rounds):
        for name, over in KNOB_CONFIGS:
            _, recs, _ = run(f"{name} r{i}", {**over, "trainer.val_before_train": False, "trainer.test_freq": -1},
                             steps, root)
            recs = [r for r in recs if r.step >= 2]
            samples[name].append({
                "throughput": statistics.median(r.get("perf/throughput") for r in recs),
                "step_s": statistics.median(r.get("timing_s/step") for r in recs),
                "gen_s": statistics.median(r.get("timing_s/gen") for r in recs),
                "update_s": statistics.median(r.get("timing_s/update_actor") for r in recs),
                "peak_gb": max(r.get("perf/max_memory_allocated_gb") for r in recs),
            })
    print(f"{'config':44s} {'tok/s':>7s} {'(range)':>13s} {'x dflt':>7s} {'step s':>7s} {'gen s':>6s} {'upd s':>6s} "
          f"{'peak GB':>8s}")
    rows = []
    for name, over in KNOB_CONFIGS:
        runs = samples[name]
        row = {"config": name, "overrides": over, "rounds": runs}
        for key in ("throughput", "step_s", "gen_s", "update_s"):
            row[key] = statistics.median(r[key] for r in runs)
        row["peak_gb"] = max(r["peak_gb"] for r in runs)
        tps = [r["throughput"] for r in runs]
        rows.append(row)
        print(f"{name:44s} {row['throughput']:7.0f} {f'({min(tps):.0f}-{max(tps):.0f})':>13s} "
              f"{row['throughput'] / rows[0]['throughput']:7.2f} {row['step_s']:7.2f} {row['gen_s']:6.2f} "
              f"{row['update_s']:6.2f} {row['peak_gb']:8.4f}")
    tps = [r["throughput"] for r in rows]
    print(f"best / worst throughput: {max(tps) / min(tps):.2f}x   best / default: {max(tps) / tps[0]:.2f}x")
    print(f"default capacity LocalBackend().memory_capacity_gb() = {LocalBackend().memory_capacity_gb()} GB")
    return rows


def bench_lr(root: Path, steps: int) -> dict:
    lr = LocalBackend().base_config()[A + "optim.lr"]
    print(f"\n== pathology: lr x 100 = {100 * lr:g} for {steps} steps (vs the default {lr:g}) ==")
    out = {}
    for label, over in (("default lr", {}), ("lr x 100", {A + "optim.lr": 100 * lr})):
        _, recs, _ = run(label, {**over, "trainer.test_freq": steps}, steps, root)
        first, last = recs[1], recs[-1]
        keys = ("critic/score/mean", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl")
        out[label] = {k: [first.get(k), last.get(k)] for k in keys} | {VAL: [recs[0].get(VAL), last.get(VAL)]}
        print(f"{label:12s} " + "  ".join(f"{k.split('/')[-1]} {a:.3f}->{b:.3f}" for k, (a, b) in out[label].items()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["30", "knobs", "lr"], action="append")
    p.add_argument("--knob-steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1, help="repeat the knob table, interleaved (timings are noisy)")
    args = p.parse_args()
    parts = args.only or ["30", "knobs", "lr"]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="mart-bench-local-") as tmp:
        root = Path(tmp)
        if "30" in parts:
            results["thirty_steps"] = bench_30(root)
        if "knobs" in parts:
            results["knobs"] = bench_knobs(root, args.knob_steps, args.rounds)
        if "lr" in parts:
            results["lr_x100"] = bench_lr(root, 10)
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"local_workload-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
