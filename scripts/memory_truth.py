"""Precompute torch's memory accounting for the shipped data (see docs/memory.md).

    python scripts/memory_truth.py probe   # small-instance probe points -> trial_runner/memory_data/probe_cache.json
    python scripts/memory_truth.py full    # full-depth truth (the test's reference) -> .../full_depth.json
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


def full() -> None:
    path = DATA / "full_depth.json"
    data = _load(path) or {"_about": "torch's accounting (FSDPMemTracker, fake tensors, fake process group) of the "
                           "full-depth model: peak bytes per rank; written by scripts/memory_truth.py full",
                           "world": WORLD, "points": {}}
    for name in TRUTH_MODELS:
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


def probe(worlds: dict[str, tuple[int, ...]]) -> None:
    for name, ws in worlds.items():
        for w in ws:
            t0 = time.time()
            mp.coefficients(MODELS[name]["config"], w)
            print(f"{name} world {w}: {time.time() - t0:.0f} s", flush=True)
    mp.export_shipped()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "probe"
    if what == "full":
        full()
    elif what == "probe":
        probe({name: (8,) for name in TRUTH_MODELS})
    else:
        raise SystemExit(__doc__)
