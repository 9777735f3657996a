"""Precompute torch's memory accounting for the shipped data (see docs/memory.md).

    python scripts/memory_truth.py probe   # small-instance probe points -> trial_runner/memory_data/probe_cache.json
    python scripts/memory_truth.py full    # full-depth truth (the test's reference) -> .../full_depth.json
    python scripts/memory_truth.py probe-sim  # the same for the scenarios' models and cluster sizes
    python scripts/memory_truth.py report     # the truth table of docs/memory.md
    python scripts/memory_truth.py sim     # the simulator's per-architecture memory -> trial_runner/sim/memory_truth.json

Each run measures only what its file lacks (delete an entry to re-measure it); CPU only, minutes per model.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mart.trial_runner import memory_probe as mp

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "trial_runner" / "memory_data"
MODELS = json.loads((DATA / "models.json").read_text())["models"]
#: the truth test's grid (issue 42): FSDP2 on 8 GPUs, checkpointing on and off, 4k and 16k tokens per micro batch
TRUTH_MODELS = ("Qwen3-0.6B", "Qwen3-4B", "Qwen3-8B", "Qwen2.5-7B", "Qwen3-32B")
TRUTH_TOKENS = (4096, 16384)
WORLD = 8


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _save(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def full(models: tuple[str, ...] = TRUTH_MODELS, path: Path = DATA / "full_depth.json") -> None:
    data = _load(path) or {"_about": "torch's accounting (FSDPMemTracker, fake tensors, fake process group) of the "
                           "full-depth model: peak bytes per rank; written by scripts/memory_truth.py full",
                           "world": WORLD, "points": {}}
    for name in models:
        arch = mp.arch_of(MODELS[name]["config"])
        for phase in ("update", "logprob"):
            # checkpointing acts only where gradients are kept: the no-grad log-prob pass is measured once
            for ckpt in ((False, True) if phase == "update" else (False,)):
                for tok in TRUTH_TOKENS:
                    key = f"{name}|{phase}|ckpt={int(ckpt)}|{tok}"
                    if key in data["points"]:
                        continue
                    pt = mp.Point(phase, int(arch["num_hidden_layers"]), tok, ckpt)
                    t0 = time.time()
                    res = mp.measure_isolated(arch, WORLD, [pt])[0]
                    data["points"][key] = {k: int(v) for k, v in res.items()}
                    _save(path, data)
                    print(f"{key}: {res['total'] / mp.GIB:.2f} GiB ({time.time() - t0:.0f} s)", flush=True)


#: the scenarios' architectures (shipped and example scenarios), by the scenario's model name
SIM_MODELS = ("Qwen3-8B", "Qwen3-0.6B-Base", "Llama-3.1-8B-Instruct", "Qwen2.5-1.5B-Instruct", "Qwen2.5-32B-Instruct",
              "Qwen2.5-7B-Instruct", "Qwen3-1.7B", "DeepSeek-R1-Distill-Qwen-7B")
#: FSDP world sizes the shipped probe cache holds per model (the scenarios' clusters), beyond the truth grid's 8
SIM_WORLDS = {"Qwen3-8B": (8, 16), "Qwen3-0.6B-Base": (8, 16), "Llama-3.1-8B-Instruct": (8, 16),
              "Qwen2.5-1.5B-Instruct": (8,), "Qwen2.5-32B-Instruct": (8, 32), "Qwen2.5-7B-Instruct": (8,),
              "Qwen3-1.7B": (8, 16), "DeepSeek-R1-Distill-Qwen-7B": (8, 16)}
SHARDED = ("sharded_param", "sharded_grad", "opt")


def sim() -> None:
    """Per scenario architecture: torch's full-depth peak, one line a + b x tokens per moment of the step (the
    highest is the peak), each split into the FSDP-sharded share and the rest, extrapolated (in this script, not
    in the simulator) from the probe's 1- and 2-layer points."""
    out = {"_about": "torch's accounting (FSDPMemTracker under fake tensors, FSDP2 over a fake process group) of "
           "each scenario model, extrapolated to full depth; bytes per rank at `world` ranks, per moment of the "
           "step a + b x tokens (the highest is the peak); written by scripts/memory_truth.py sim",
           "world": WORLD, "models": {}}
    groups = {"sharded": SHARDED, "rest": ("unsharded_param", "buffer", "all_gather", "unsharded_grad",
                                           "reduce_scatter", "act", "temp", "inp")}
    for name in SIM_MODELS:
        arch = mp.arch_of(MODELS[name]["config"])
        depth = int(arch["num_hidden_layers"])
        pts = [mp.Point(ph, lay, tok, ck) for ph in ("update", "logprob") for ck in (False, True)
               for lay in mp.PROBE_LAYERS for tok in mp.PROBE_TOKENS]
        res = dict(zip(pts, mp.probe(arch, WORLD, pts)))
        entry = {"hf_path": MODELS[name]["hf_path"], "layers": depth, "hidden": int(arch["hidden_size"])}
        for ph in ("update", "logprob"):
            entry[ph] = {str(int(ck)): [{part: [round(a), round(b, 3)] for part, (a, b) in line.items()
                                         if part != "total"}
                                        for line in mp.extrapolate(res, depth, ph, ck, groups=groups)]
                         for ck in (False, True)}
        out["models"][name] = entry
    _save(ROOT / "trial_runner" / "sim" / "memory_truth.json", out)


def report() -> None:
    """The truth table for docs/memory.md: mart memory's prediction vs torch's full-depth accounting."""
    import os
    import tempfile

    from mart.graph.memory_cmd import run
    from mart.nodes.agents.job_model import CUDA_CONTEXT_GB

    os.environ["MART_MEMORY_PROBE"] = "cached"
    truth = _load(DATA / "full_depth.json")["points"]
    print("| model | tokens | checkpointing | update: torch / mart (GiB) | error | log-prob: torch / mart | error |")
    print("|---|---|---|---|---|---|---|")
    worst = {"update": 0.0, "logprob": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for name in TRUTH_MODELS:
            for tok in TRUTH_TOKENS:
                for ckpt in (False, True):
                    cfg = {"actor_rollout_ref.model.path": MODELS[name]["hf_path"],
                           "actor_rollout_ref.actor.strategy": "fsdp2", "actor_rollout_ref.actor.use_dynamic_bsz": True,
                           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": tok,
                           "actor_rollout_ref.model.enable_gradient_checkpointing": ckpt,
                           "data.train_batch_size": 64, "data.max_prompt_length": 1024,
                           "data.max_response_length": tok - 1024}
                    path = Path(tmp) / "c.json"
                    path.write_text(json.dumps(cfg))
                    got = run(path, [], "H100-80GB", 1, WORLD, logits="fp32")["phases"]
                    row = [name, str(tok), "on" if ckpt else "off"]
                    for phase, verl in (("update", "update_actor"), ("logprob", "old_log_prob")):
                        key = f"{name}|{phase}|ckpt={int(ckpt and phase == 'update')}|{tok}"
                        if key not in truth:
                            row += ["-", "-"]
                            continue
                        t = truth[key]["total"] / mp.GIB
                        p = got[verl]["peak_gb"] - CUDA_CONTEXT_GB
                        if phase == "logprob":  # torch's no-grad pass held no optimizer; verl keeps Adam resident
                            p -= got[verl]["parts"]["optimizer_state"]
                        err = p / t - 1
                        worst[phase] = max(worst[phase], abs(err))
                        row += [f"{t:.2f} / {p:.2f}", f"{100 * err:+.1f}%"]
                    print("| " + " | ".join(row) + " |")
    print(f"\nlargest error: update {100 * worst['update']:.1f}%, log-prob {100 * worst['logprob']:.1f}%")


def probe(worlds: dict[str, tuple[int, ...]]) -> None:
    for name, ws in worlds.items():
        for w in ws:
            t0 = time.time()
            mp.coefficients(MODELS[name]["config"], w)
            print(f"{name} world {w}: {time.time() - t0:.0f} s", flush=True)
    mp.export_shipped()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "probe"
    if what == "full":  # full [OUT.json MODEL ...]: a part of the grid into another file (merged by hand)
        if len(sys.argv) > 3:
            full(tuple(sys.argv[3:]), Path(sys.argv[2]))
        else:
            full()
    elif what == "probe":
        probe({name: (8,) for name in TRUTH_MODELS})
    elif what == "probe-sim":  # world 8 of every model first (the simulator's data), then the larger clusters
        probe({name: (8,) for name in SIM_MODELS})
        probe({name: tuple(w for w in ws if w != 8) for name, ws in SIM_WORLDS.items()})
    elif what == "sim":
        sim()
    elif what == "report":
        report()
    else:
        raise SystemExit(__doc__)
