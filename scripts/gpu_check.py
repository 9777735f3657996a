"""The GPU check (``scripts/gpu_check.sh`` runs this): mart's local backend on one CUDA device, device memory
peaks read under ``CUDA_VISIBLE_DEVICES``, and the memory-margin rule against the real device. One JSON
verdict on stdout; progress on stderr. docs/backends.md ("GPU check") says what it shows and what it needs.

Plan (``--dry-run`` prints it without touching a GPU):

1. environment: torch and its CUDA device, ``CUDA_VISIBLE_DEVICES``, the device-memory source: NVML
   (``pynvml``, from nvidia-ml-py) when importable, else ``torch.cuda.mem_get_info`` (also device-wide);
   NVML's visible devices must be torch's.
2. ``base`` and ``micro16``: two local-backend trials on CUDA with a model large enough to matter (default
   24 layers x 1024 wide, ~300M parameters; padded batches, so memory does not depend on what the policy
   writes), uncapped; each one's torch peak (``perf/max_memory_allocated_gb``, what the margin rule reads)
   and device-wide growth.
3. mart's memory model (``MemoryModel``, the critic's predictor without a job model) is fitted on them; the
   ``at-margin`` candidate (micro batch 32) is predicted, and an emulated capacity is set so that the limit
   ``(1 - margin) x capacity`` is 3% above that prediction; the first of the heavier candidates (gradient
   checkpointing off, micro batch 32, 64) predicted more than 10% over the limit is the ``over-margin`` one.
4. mart's rules critic judges both against that limit: ``over-margin`` must be refused, ``at-margin`` accepted.
5. ``at-margin`` runs with the allocator capped at the emulated capacity (the local worker's
   ``--memory-capacity-gb`` on CUDA): it must complete with its torch peak within the limit; its device-wide
   growth (CUDA context and allocator cache included) is reported against the capacity.
6. ``over-margin`` runs under the same cap, to see whether the refusal was right (an OOM or a peak over the
   limit) or the model over-predicted (reported, not a failure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GIB = 1024**3
MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing"
AT_MARGIN = {MICRO: 32}
HEAVIER = ({MICRO: 32, CKPT: False}, {MICRO: 64, CKPT: False})
CALIBRATION = (("base", {}), ("micro16", {MICRO: 16}))
LIMIT_SLACK = 1.03  # the limit sits 3% above the at-margin prediction
OVER_FACTOR = 1.10  # an over-margin candidate is predicted > 10% above the limit


def workload(layers: int, width: int, device: str = "cuda") -> dict[str, Any]:
    """The local workload at a size that matters on a GPU (flat keys; docs/backends.md "Keys")."""
    return {
        "local.device": device, "local.model.n_layer": layers, "local.model.n_embd": width,
        "local.model.n_head": max(1, width // 64), "local.model.block_size": 64,
        "local.base_model.warmup_steps": 20, "local.base_model.lr": 3e-4, "local.task.val_size": 32,
        "data.max_response_length": 32, "actor_rollout_ref.model.use_remove_padding": False,
        "actor_rollout_ref.rollout.max_num_seqs": 128, "trainer.test_freq": -1, "trainer.val_before_train": False,
    }


def plan(args: argparse.Namespace) -> dict[str, Any]:
    params_m = round(12 * args.layers * args.width**2 / 1e6, 1)
    where = "the CPU (--smoke-cpu: no GPU figures)" if args.smoke_cpu else "CUDA"
    return {
        "model": f"{args.layers} layers x {args.width} wide (~{params_m}M parameters), local backend on {where}",
        "trials": [f"{name}: {over or 'defaults'}, {args.steps} steps, uncapped" for name, over in CALIBRATION]
        + [f"at-margin: {AT_MARGIN}, capped at the emulated capacity",
           f"over-margin: the first of {list(HEAVIER)} predicted > {OVER_FACTOR:.2f} x the limit, same cap"],
        "margin": args.margin,
        "limit_rule": f"limit = (1 - margin) x capacity, capacity emulated so that limit = {LIMIT_SLACK:.2f} x "
                      "the at-margin prediction (mart's MemoryModel fitted on the two calibration trials)",
        "checks": ["cuda_device", "nvml_visible_matches_torch (when NVML is importable)", "calibration_completed",
                   "over_margin_refused", "at_margin_accepted", "at_margin_completed", "at_margin_within_limit"],
        "memory_source": "NVML (pynvml) when importable, else torch.cuda.mem_get_info (device-wide)",
        "out": args.out,
    }


# ------------------------------------------------------------------------------------------- device memory

class DeviceMemory:
    """Device-wide used memory of the visible GPU(s): NVML when importable, else ``cudaMemGetInfo``."""

    def __init__(self, cuda: bool = True) -> None:
        if not cuda:  # --smoke-cpu: no device to read
            self.source = "none (CPU smoke run)"
            return
        try:
            import pynvml  # noqa: F401

            from mart.trial_runner.gpu import probe

            self.source = "nvml" if probe() else "torch.cuda.mem_get_info"
        except ImportError:
            self.source = "torch.cuda.mem_get_info"

    def used_gb(self) -> float:
        if self.source.startswith("none"):
            return 0.0
        if self.source == "nvml":
            from mart.trial_runner.gpu import used_memory_gb

            used = used_memory_gb()
            return max(used.values()) if used else float("nan")
        import torch

        free, total = torch.cuda.mem_get_info(0)
        return (total - free) / GIB


class PeakWatch:
    """Samples ``DeviceMemory.used_gb`` in a thread: the peak, and what was used before."""

    def __init__(self, mem: DeviceMemory, interval_s: float = 0.05) -> None:
        self.mem, self.interval_s = mem, interval_s
        self.before = mem.used_gb()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.mem.used_gb())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak = max(self.peak, self.mem.used_gb())

    @property
    def growth_gb(self) -> float:
        return self.peak - self.before


def visible_devices(mem: DeviceMemory) -> dict[str, Any]:
    """What torch and NVML see under ``CUDA_VISIBLE_DEVICES`` (they must agree)."""
    import torch

    out: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                           "torch_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    if mem.source == "nvml":
        from mart.trial_runner.gpu import probe

        gpus = probe()
        out["nvml_devices"] = [g.name for g in gpus]
        out["nvml_total_gb"] = [round(g.total_gb, 2) for g in gpus]
        out["match"] = len(gpus) == torch.cuda.device_count() and all(
            g.name == t for g, t in zip(gpus, out["torch_devices"]))
    return out


# ------------------------------------------------------------------------------------------- trials

def run_trial(name: str, config: dict[str, Any], steps: int, out: Path, mem: DeviceMemory,
              cap_gb: float | None = None, timeout_s: float = 240.0) -> dict[str, Any]:
    """One local-backend trial process on CUDA (``python -m mart.trial_runner.local``) with device peaks sampled."""
    trial = out / name
    trial.mkdir(parents=True)
    (trial / "config.json").write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "mart.trial_runner.local", "--out", str(trial), "--steps", str(steps),
           "--config", str(trial / "config.json")]
    if cap_gb is not None:
        cmd += ["--memory-capacity-gb", f"{cap_gb:.4f}"]
    print(f"[gpu_check] {name}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    t0 = time.time()
    with PeakWatch(mem) as watch, open(trial / "trial.log", "wb") as log:
        try:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
    status = json.loads((trial / "status.json").read_text()) if (trial / "status.json").exists() else {}
    recs = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()] \
        if (trial / "metrics.jsonl").exists() else []
    peaks = [r["data"].get("perf/max_memory_allocated_gb") for r in recs if r["step"] >= 1]
    thr = sorted(r["data"]["perf/throughput"] for r in recs if r["step"] >= 2 and "perf/throughput" in r["data"])
    result = {
        "status": status.get("status", "no status.json" if rc is not None else "timeout"), "rc": rc,
        "reason": status.get("reason"), "wall_s": round(time.time() - t0, 1), "steps": len(peaks),
        "trial_peak_gb": max((p for p in peaks if p is not None), default=None),
        "device_growth_gb": round(watch.growth_gb, 3), "device_before_gb": round(watch.before, 3),
        "median_throughput": thr[len(thr) // 2] if thr else None, "overrides": {k: config[k] for k in config
                                                                                 if k in (MICRO, CKPT)},
    }
    if result["status"] != "completed":
        result["log_tail"] = (trial / "trial.log").read_text(errors="replace").splitlines()[-8:]
    print(f"[gpu_check] {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


def _history(base_config: dict[str, Any], measured: dict[str, dict[str, Any]]) -> list:
    from mart.state.models import TrialRecord, TrialStatus

    return [TrialRecord(trial_id=name, stage="system", config={**base_config, **m["overrides"]},
                        status=TrialStatus.COMPLETED, peak_memory_gb=m["trial_peak_gb"]) for name, m in measured.items()]


def memory_model(base_config: dict[str, Any], measured: dict[str, dict[str, Any]]):
    """mart's memory model (``MemoryModel``, the critic's predictor without a job model) fitted on the measured
    trials' peaks (``perf/max_memory_allocated_gb``: what the margin rule reads for the local backend)."""
    from mart.nodes.agents.memory_model import MemoryModel
    from mart.trial_runner.local.space import SEARCH_SPACE

    return MemoryModel.fit(_history(base_config, measured), [p.key for p in SEARCH_SPACE.params])


def critic_verdicts(base_config: dict[str, Any], measured: dict[str, dict[str, Any]], candidates: dict[str, dict],
                    limit_gb: float) -> dict[str, dict[str, Any]]:
    """mart's rules critic on ``candidates`` (name -> overrides) against ``limit_gb``."""
    from mart.nodes.agents.base import AgentContext
    from mart.nodes.agents.rules import RulesCritic
    from mart.state.models import Candidate
    from mart.trial_runner.local.space import SEARCH_SPACE

    ctx = AgentContext(stage="system", objective="throughput", search_space=SEARCH_SPACE, base_config=base_config,
                       best_overrides={}, profile=None, history=_history(base_config, measured), feedback=[],
                       memory_limit_gb=limit_gb, predict_memory=memory_model(base_config, measured).predict,
                       num_candidates=len(candidates))
    cands = [Candidate(candidate_id=name, stage="system", overrides=over, expected_gain=0.1)
             for name, over in candidates.items()]
    verdict = RulesCritic().critique(ctx, cands)
    return {c.candidate_id: {"accepted": c.accepted, "predicted_gb": c.predicted_memory_gb, "reasons": c.reasons}
            for c in verdict.critiques}


def margin_setup(at_pred_gb: float, margin: float) -> tuple[float, float]:
    """(emulated capacity, limit): the limit ``(1 - margin) x capacity`` sits ``LIMIT_SLACK`` above the
    at-margin prediction."""
    limit = LIMIT_SLACK * at_pred_gb
    return limit / (1.0 - margin), limit


def judge(env: dict[str, Any], trials: dict[str, dict[str, Any]], critic: dict[str, dict[str, Any]],
          limit_gb: float | None) -> dict[str, Any]:
    """The checks and the verdict from what was measured (no GPU needed: tested on its own)."""
    checks: dict[str, bool] = {"cuda_device": bool(env.get("cuda"))} if not env.get("smoke_cpu") else {}
    if "match" in env.get("visible", {}):
        checks["nvml_visible_matches_torch"] = bool(env["visible"]["match"])
    checks["calibration_completed"] = all(trials.get(n, {}).get("status") == "completed" for n, _ in CALIBRATION)
    over, at = critic.get("over-margin"), critic.get("at-margin")
    checks["over_margin_refused"] = bool(over) and not over["accepted"] and any(
        "exceeds the limit" in r for r in over["reasons"])
    checks["at_margin_accepted"] = bool(at) and at["accepted"]
    run = trials.get("at-margin", {})
    checks["at_margin_completed"] = run.get("status") == "completed"
    peak = run.get("trial_peak_gb")
    checks["at_margin_within_limit"] = peak is not None and limit_gb is not None and peak <= limit_gb
    notes = []
    heavy = trials.get("over-margin")
    if heavy and limit_gb is not None:
        hp = heavy.get("trial_peak_gb")
        if heavy.get("status") == "oom":
            notes.append(f"the refusal was right: over-margin ran out of the emulated capacity ({heavy.get('reason')})")
        elif hp is not None and hp > limit_gb:
            notes.append(f"the refusal was right: over-margin peaked at {hp:.3f} GB > limit {limit_gb:.3f} GB")
        else:
            notes.append(f"the model over-predicted: over-margin ran {heavy.get('status')} at {hp} GB "
                         f"(limit {limit_gb:.3f} GB)")
    if run.get("device_growth_gb") is not None and peak is not None and not env.get("smoke_cpu"):
        notes.append(f"at-margin device-wide growth {run['device_growth_gb']:.3f} GB vs its torch peak {peak:.3f} GB "
                     f"(source {env.get('memory_source')}): the difference is the CUDA context and the allocator's "
                     "cache, which the margin rule's reading (torch's) does not see")
    return {"verdict": "pass" if all(checks.values()) else "fail", "checks": checks, "notes": notes}


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        import torch
    except ImportError:
        env["torch"] = None
        return env
    env.update(torch=torch.__version__, cuda=torch.cuda.is_available())
    if env["cuda"]:
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, device_total_gb=round(props.total_memory / GIB, 2))
    import importlib.util

    for mod in ("transformers", "pydantic", "psutil", "pynvml", "verl", "vllm", "ray"):
        env[mod] = importlib.util.find_spec(mod) is not None
    return env


def mart_missing() -> str | None:
    """Why mart's trial and critic code cannot be imported here (a missing dependency), or None."""
    try:
        import mart
        import mart.nodes.agents.rules  # noqa: F401
        import mart.trial_runner.local.worker  # noqa: F401
    except ImportError as e:
        return (f"{e}: carry a wheelhouse (`scripts/gpu_check.sh --wheelhouse` on a machine with PyPI writes .whl/; "
                "carry .whl with the tree)")
    print(f"[gpu_check] mart imported from {os.path.dirname(mart.__file__)}", file=sys.stderr)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    p.add_argument("--steps", type=int, default=3, help="training steps per trial (default 3)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--margin", type=float, default=0.1, help="mart's default memory margin")
    p.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default $OUT, else a new temp dir)")
    p.add_argument("--smoke-cpu", action="store_true",
                   help="run the whole check on the CPU with a tiny model: exercises this script, measures no GPU")
    args = p.parse_args(argv)
    if args.smoke_cpu and (args.layers, args.width) == (24, 1024):
        args.layers, args.width = 2, 64
    if args.dry_run:
        print(json.dumps({"verdict": "dry-run", "plan": plan(args), "environment": environment()}, indent=1))
        return 0
    out = Path(args.out or tempfile.mkdtemp(prefix="mart-gpu-check-")) / "gpu-check"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # the base model, shared by the trials; outside --out (a device returns what is under $OUT, 64 MiB at most)
    cache = None if os.environ.get("MART_CACHE_DIR") else tempfile.mkdtemp(prefix="mart-gpu-cache-")
    if cache:
        os.environ["MART_CACHE_DIR"] = cache
    try:
        return _check(args, out)
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


def _check(args: argparse.Namespace, out: Path) -> int:
    env = environment()
    result: dict[str, Any] = {"verdict": "skipped", "environment": env, "plan": plan(args)}
    if args.smoke_cpu:
        env["smoke_cpu"] = "a CPU run of this script's code paths: none of its figures are GPU figures"
    reason = None if env.get("cuda") or (args.smoke_cpu and env.get("torch")) else (
        "no CUDA device visible to torch" if env.get("torch") else "torch is not importable")
    reason = reason or mart_missing()
    if reason:
        result["reason"] = reason
        print(json.dumps(result, indent=1))
        return 1
    cuda = not args.smoke_cpu
    if cuda:
        import torch

        torch.cuda.init()  # this process's own context exists before any "before" reading
    mem = DeviceMemory(cuda)
    env.update(memory_source=mem.source, visible=visible_devices(mem) if cuda else {})
    base = workload(args.layers, args.width, "cuda" if cuda else "cpu")
    trials: dict[str, dict[str, Any]] = {}
    for name, over in CALIBRATION:
        trials[name] = run_trial(name, {**base, **over}, args.steps, out, mem)
    critic: dict[str, dict[str, Any]] = {}
    limit = capacity = None
    measured = {n: trials[n] for n, _ in CALIBRATION
                if trials[n]["status"] == "completed" and trials[n]["trial_peak_gb"]}
    if len(measured) == len(CALIBRATION):
        model = memory_model(base, measured)
        capacity, limit = margin_setup(model.predict({**base, **AT_MARGIN}), args.margin)
        heavy = next((h for h in HEAVIER if (model.predict({**base, **h}) or 0) > OVER_FACTOR * limit), HEAVIER[-1])
        critic = critic_verdicts(base, measured, {"at-margin": AT_MARGIN, "over-margin": heavy}, limit)
        result["margin"] = {"margin": args.margin, "emulated_capacity_gb": round(capacity, 4),
                            "limit_gb": round(limit, 4), "critic": critic}
        trials["at-margin"] = run_trial("at-margin", {**base, **AT_MARGIN}, args.steps, out, mem, cap_gb=capacity)
        trials["over-margin"] = run_trial("over-margin", {**base, **heavy}, args.steps, out, mem, cap_gb=capacity)
    result.update(trials=trials, **judge(env, trials, critic, limit))
    print(json.dumps(result, indent=1))
    return 0 if result["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
