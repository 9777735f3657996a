"""The trial process: one GRPO run writing verl-format metrics into its own trial directory.

    python -m mart.trial_runner.local --out DIR --steps N --config DIR/config.json \\
        [--memory-capacity-gb X] [--seed S] [--save-steps 10,20] [--init-from CKPT_DIR]

Writes ``DIR/metrics.jsonl`` (a step-0 validation record, then one line per step 1..N), prints a
console line per step (the runner sends stdout/stderr to ``DIR/trial.log``) and ends with
``DIR/status.json`` and one of these exit codes (checkpoints, when asked for, go to
``DIR/checkpoints/global_step_N/``; a trial started ``--init-from`` a checkpoint of step K writes its
validation at step K, then trains steps K+1..N: see ``checkpoint.py`` for what is restored):

    0  completed   all N steps done
    1  failed      an error (traceback in trial.log)
    2  failed      the config was rejected (before any step)
    3  oom         the step's peak memory exceeded --memory-capacity-gb (or a real out-of-memory)
    4  stopped     SIGTERM or SIGINT (ends within a fraction of a second)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import traceback
from functools import partial
from pathlib import Path

from mart.state.files import open_in
from mart.state.search_space import ConfigError
from mart.state.trials import METRICS_FILE, checkpoint_dir
from mart.trial_runner.base import write_final_status
from mart.trial_runner.local import memory
from mart.trial_runner.metrics import write_record
from mart.trial_runner.process import launch_record

EXIT_COMPLETED, EXIT_FAILED, EXIT_CONFIG, EXIT_OOM, EXIT_STOPPED = 0, 1, 2, 3, 4


class TrialStopped(Exception):
    """SIGTERM/SIGINT arrived: stop at once and say so."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mart.trial_runner.local", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="trial directory")
    p.add_argument("--steps", type=int, default=None, help="training steps (overrides trainer.total_training_steps)")
    p.add_argument("--config", default=None, help="JSON file of flat verl keys (overrides of the defaults)")
    p.add_argument("--memory-capacity-gb", type=float, default=None, help="emulated device memory")
    p.add_argument("--seed", type=int, default=None, help="overrides the config's seed")
    p.add_argument("--save-steps", default="", help="comma-separated global steps after which to save a checkpoint")
    p.add_argument("--init-from", default=None, help="checkpoint directory to start from (global_step_N)")
    return p.parse_args(argv)


def _on_signal(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise TrialStopped(f"received {signal.Signals(signum).name}")


def _console(step: int, m: dict) -> str:
    keys = ("critic/score/mean", "response_length/mean", "actor/entropy", "actor/grad_norm", "perf/throughput",
            "perf/max_memory_allocated_gb", "timing_s/step")
    parts = [f"step:{step}"] + [f"{k}:{m[k]:.4g}" for k in keys if k in m]
    parts += [f"{k}:{v:.4f}" for k, v in m.items() if k.startswith("val-core/")]
    return " - ".join(parts)


def run(args: argparse.Namespace, out: Path, progress: dict) -> None:
    from mart.trial_runner.local.checkpoint import load_checkpoint, save_checkpoint
    from mart.trial_runner.local.config import load_config, resolve_threads, to_flat
    from mart.trial_runner.local.team_config import is_team_config, load_team_config

    overrides = json.loads(Path(args.config).read_text()) if args.config else {}
    if args.steps is not None:
        overrides["trainer.total_training_steps"] = args.steps
    if args.seed is not None:
        overrides["seed"] = args.seed
    team = load_team_config(overrides) if is_team_config(overrides) else None  # multi-agent (workflow.name)
    cfg = team.base if team is not None else load_config(overrides)
    steps = cfg.total_training_steps
    try:
        save_steps = {int(s) for s in args.save_steps.split(",") if s.strip()}
    except ValueError:
        raise ConfigError(f"`--save-steps` must be comma-separated integers, but got {args.save_steps!r}.") from None

    import torch

    from mart.trial_runner.local.base_model import load_base_model
    from mart.trial_runner.local.grpo import GRPOTrainer
    from mart.trial_runner.local.timing import CPU, Timer, compared_clock

    torch.set_num_threads(resolve_threads(cfg))
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    if use_cuda and args.memory_capacity_gb:  # a real allocation failure above the capacity, too
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_capacity_gb * memory.GB / total))
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # its lazy imports (~70 MB) are not the workload's
    monitor = memory.MemoryMonitor(args.memory_capacity_gb, device.type)
    monitor.start()
    kind = "GRPO" if team is None else f"multi-agent GRPO ({team.workflow}, {team.num_agents} agents)"
    clock = compared_clock(cfg.throughput_clock, device.type, torch.get_num_threads())
    print(f"local {kind} trial: {steps} steps on {device} ({torch.get_num_threads()} threads, "
          f"throughput compared on {'CPU time' if clock == CPU else 'the wall clock'}, "
          f"capacity {args.memory_capacity_gb} GB, seed {cfg.seed}, pid {os.getpid()})", flush=True)

    base = load_base_model(cfg, device, log=lambda s: print(s, flush=True))
    flat = to_flat(cfg)
    if team is None:
        trainer = GRPOTrainer(cfg, base, device, steps)
        save, load = save_checkpoint, partial(load_checkpoint, cfg=cfg)
    else:
        from mart.trial_runner.local.multi_agent import (
            TeamTrainer,
            load_team_checkpoint,
            save_team_checkpoint,
        )

        trainer = TeamTrainer(team, base, device, steps)
        flat.update({k: overrides[k] for k in overrides if k.startswith(("workflow.", "reward.", "agents."))})
        flat.setdefault("workflow.num_agents", team.num_agents)
        save, load = save_team_checkpoint, load_team_checkpoint
    trainer.probe = monitor.sample  # after each forward, where activations peak
    start = 0
    if args.init_from:
        start = load(trainer, args.init_from, flat_config=flat)
        if start >= steps:
            raise ConfigError(f"`trainer.total_training_steps` ({steps}) must be > the checkpoint's step ({start}).")
        progress["last_step"] = start
        print(f"branch: restored policy, optimizer and data position of global step {start} from {args.init_from}",
              flush=True)
    monitor.check()

    def sync():
        if use_cuda:
            torch.cuda.synchronize()

    def validate(metrics: dict) -> None:
        monitor.enter("testing")
        t0 = time.perf_counter()
        metrics.update(trainer.validate())
        sync()
        metrics["timing_s/testing"] = time.perf_counter() - t0
        monitor.check()

    with open_in(out, METRICS_FILE, "w") as f:  # truncate, as verl's file logger; never through a link
        if cfg.val_before_train:
            metrics: dict = {}
            validate(metrics)
            metrics["training/global_step"] = start
            write_record(f, start, metrics)
            print(_console(start, metrics), flush=True)
        for step in range(start + 1, steps + 1):
            monitor.reset_peak()
            timer = Timer(device, on_enter=monitor.enter, on_exit=monitor.check, clock=clock)
            with timer.step():
                metrics = trainer.step(timer)
            tokens = metrics["perf/total_num_tokens"]
            n_resp = getattr(trainer, "last_num_responses", 0) or cfg.train_batch_size * cfg.rollout_n
            n_resp *= metrics["response_length/mean"]
            metrics.update(timer.metrics(tokens))
            metrics.update({
                "timing_per_token_ms/gen": 1000 * timer.times["gen"] / max(n_resp, 1),
                "timing_per_token_ms/update_actor": 1000 * timer.times["update_actor"] / tokens,
                "perf/max_memory_allocated_gb": monitor.peak_gb(),
                "perf/cpu_memory_used_gb": monitor.used_gb(),
            })
            if "ref" in timer.times:
                metrics["timing_per_token_ms/ref"] = 1000 * timer.times["ref"] / tokens
            monitor.check()
            if cfg.test_freq > 0 and (step % cfg.test_freq == 0 or step == steps):
                validate(metrics)
            metrics["training/global_step"] = step
            if step in save_steps:
                t0 = time.perf_counter()
                save(trainer, step, checkpoint_dir(str(out), step), flat)
                metrics["timing_s/save_checkpoint"] = time.perf_counter() - t0
            with _signals_held():  # the line and the step count move together: a stop never lands between them
                write_record(f, step, metrics)
                progress["last_step"] = step
            print(_console(step, metrics), flush=True)
    monitor.stop()


@contextlib.contextmanager
def _signals_held():
    """Hold SIGTERM/SIGINT for the few microseconds of a block (delivered right after it): status.json's last step
    and the metric stream's last line then always agree."""
    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, (memory.MemoryCapacityExceeded, MemoryError)):
        return True
    oom_type = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    return oom_type is not None and isinstance(e, oom_type)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    progress = {"last_step": 0}
    try:
        try:
            run(args, out, progress)
            status, reason, code = "completed", None, EXIT_COMPLETED
        except TrialStopped as e:
            status, reason, code = "stopped", str(e), EXIT_STOPPED
        except ConfigError as e:
            status, reason, code = "failed", f"invalid config: {e}", EXIT_CONFIG
        except BaseException as e:  # noqa: BLE001 - every ending gets a status
            if _is_oom(e):
                status, reason, code = "oom", str(e) or type(e).__name__, EXIT_OOM
            else:
                traceback.print_exc()
                status, reason, code = "failed", f"{type(e).__name__}: {e}", EXIT_FAILED
    except TrialStopped as e:  # a signal that landed inside a handler above
        status, reason, code = "stopped", str(e), EXIT_STOPPED
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    write_final_status(out, status, reason, progress["last_step"], launch=launch_record())
    print(f"trial {status}" + (f": {reason}" if reason else "") + f" (last step {progress['last_step']})", flush=True)
    sys.stderr.flush()
    os._exit(code)  # no slow interpreter teardown: the stop must take well under 2 s
