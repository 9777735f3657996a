"""Does training a debate pay on the local workload, as MARTI's paper reports it does on math? (issue 14)

    python bench/local_multi_agent.py                 # 3 seeds, tiny config (a few minutes on 2 cores)
    python bench/local_multi_agent.py --seeds 0 --steps 20   # a quick look

Per seed, on the same tiny model family and the same cached base model, the held-out score (greedy,
``val-core/digit_sort/reward/mean@1``) of:

1. the untrained debate: the agents before any update (the debate trial's step-0 validation);
2. the trained debate: ``--steps`` steps of multi-agent GRPO (2 agents, 2 rounds, shaping as given);
3. a single agent trained at an equal generation budget: the debate generates agents x rounds answers
   per episode, so the single agent trains agents x rounds times as many steps on the same batch
   (the same number of generated responses, and as many updated samples);
4. the single agent untrained (the base model alone), and trained as many steps as the debate (a quarter
   of the debate's generation), for reference.

MARTI's claim in kind: 2 > 1 and 2 > 3 (their Qwen2.5-3B debate 2x2: 46.0 vs single-agent GRPO 37.9).
Figures are printed as they fall, with the mean and the per-seed values; results go to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mart.trial_runner.local.config import TINY_CONFIG

ROOT = Path(__file__).resolve().parent.parent
VAL = "val-core/digit_sort/reward/mean@1"

# the tests' tiny workload, with room for the debate prompts (block_size 40); validation at the default freq
TINY = {**{k: v for k, v in TINY_CONFIG.items() if k != "trainer.test_freq"},
        "local.model.block_size": 40, "local.task.val_size": 128}


def run_trial(config: dict, steps: int, seed: int, out: Path) -> dict[int, dict]:
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**config, "trainer.test_freq": steps}
    (out / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "mart.trial_runner.local", "--out", str(out), "--steps", str(steps),
           "--config", str(out / "config.json"), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"trial failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["data"] for r in records}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=40, help="debate steps (the single agent gets agents x rounds as many)")
    p.add_argument("--workflow", default="debate", choices=("debate", "chain"))
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--shaping", default="quality", choices=("none", "margin", "quality"))
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--peer-prob", type=float, default=0.0,
                   help="local.base_model.peer_prob of the base model both start from (0.5: it can read the debate format)")
    p.add_argument("--budget", default="steps", choices=("steps", "samples"),
                   help="how the single agent gets the debate's generation budget: agents x rounds times the steps, "
                        "or the same steps with agents x rounds times rollout.n (bigger groups)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    os.environ.setdefault("MART_CACHE_DIR", str(Path(tempfile.gettempdir()) / "mart-bench-cache"))
    team = {"workflow.name": args.workflow, "workflow.num_agents": args.agents, "workflow.num_rounds": args.rounds,
            "reward.shaping_mode": args.shaping, "reward.shaping_alpha": args.alpha}
    tiny = {**TINY, "local.base_model.peer_prob": args.peer_prob}
    gens_per_episode = args.agents * (args.rounds if args.workflow == "debate" else 1)
    single_steps = args.steps * gens_per_episode if args.budget == "steps" else args.steps
    single = dict(tiny)
    if args.budget == "samples":
        single["actor_rollout_ref.rollout.n"] = 8 * gens_per_episode  # the default n is 8
    rows = []
    with tempfile.TemporaryDirectory(prefix="mart-bench-ma-") as tmp:
        for seed in seeds:
            t0 = time.perf_counter()
            d = run_trial({**tiny, **team}, args.steps, seed, Path(tmp, f"team-{seed}"))
            t_team = time.perf_counter() - t0
            t0 = time.perf_counter()
            s = run_trial(single, single_steps, seed, Path(tmp, f"single-{seed}"))
            t_single = time.perf_counter() - t0
            same = run_trial(tiny, args.steps, seed, Path(tmp, f"same-{seed}"))
            last_d, last_s = d[max(d)], s[max(s)]
            row = {"seed": seed, "team_untrained": d[0][VAL], "team_trained": last_d[VAL],
                   "single_untrained": s[0][VAL], "single_trained": last_s[VAL],
                   "single_trained_same_steps": same[max(same)][VAL],
                   "agents_trained_alone_in_team": [last_d[k] for k in sorted(last_d) if "/agent" in k and k.startswith("val-aux")],
                   "agreement": last_d.get("workflow/agreement"), "answer_change_rate": last_d.get("workflow/answer_change_rate"),
                   "team_s": round(t_team, 1), "single_s": round(t_single, 1)}
            rows.append(row)
            print(f"seed {seed}: {args.workflow} untrained {row['team_untrained']:.3f} -> trained {row['team_trained']:.3f} "
                  f"({args.steps} steps, {t_team:.0f} s) | single untrained {row['single_untrained']:.3f} -> trained "
                  f"{row['single_trained']:.3f} ({single_steps} steps, {t_single:.0f} s)", flush=True)
    print(f"\n{args.workflow}, {args.agents} agents" + (f", {args.rounds} rounds" if args.workflow == "debate" else "")
          + f", shaping {args.shaping} alpha {args.alpha}, base peer_prob {args.peer_prob}; equal generation budget: the single agent gets {gens_per_episode} x "
          + ("the steps" if args.budget == "steps" else "rollout.n"))
    for key in ("team_untrained", "team_trained", "single_untrained", "single_trained", "single_trained_same_steps"):
        vals = [r[key] for r in rows]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        print(f"  {key:26s} mean {statistics.mean(vals):.3f} (sd {sd:.3f})  per seed " + " ".join(f"{v:.3f}" for v in vals))
    wins_u = sum(r["team_trained"] > r["team_untrained"] for r in rows)
    wins_s = sum(r["team_trained"] > r["single_trained"] for r in rows)
    print(f"  trained {args.workflow} > untrained {args.workflow} in {wins_u}/{len(rows)} seeds; > single agent at equal budget in "
          f"{wins_s}/{len(rows)} seeds")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"local_multi_agent_{args.workflow}_{args.agents}_{args.budget}_{args.peer_prob}.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
