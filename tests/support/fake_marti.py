"""A stand-in for ``python -m marti.cli.multi_agent_train_ppo_ray``: MARTI's CLI and console output, no GPU.

    python tests/support/fake_marti.py --agents '{"0": {...}}' '{"1": {...}}' --flag=value ...

* The command line is parsed with MARTI's flags (the table mart extracted from MARTI's argparse calls), so an
  unknown flag, a wrong type, a bad choice or a missing ``--agents`` exits 2 with argparse's message, as MARTI's
  parser would. Then MARTI's post-parse steps run: each agent's config is filled from ``--default_agent`` and the
  global flags, and MARTI's asserts (sample batches vs actor processes, group estimators need n > 1, colocation
  layout, micro_rollout_batch_size == 1) fail the way MARTI fails (AssertionError traceback, exit 1).
* Output is MARTI's: its logger's format (``LEVEL MM-DD HH:MM:SS file.py:LINE] message``) from the trainer actor
  (Ray's ``(MultiAgent_PPOTrainer pid=N)`` prefix), the phase lines of ``MultiAgent_PPOTrainer.fit``, one
  ``✨ Global step N: {status}`` per trained agent with the actor's status keys, and after an evaluation
  (``--eval_steps``, ``--eval_before_training``) ``✨ Evaluation completed, global_step N, eval_metrics: {...}``
  with the last agent's ``eval_agent<i>_<source>_pass1`` keys (as MARTI prints it without wandb).
* Timestamps follow a simulated clock: each phase advances it by a modelled duration (a plausible cost model of
  rollout, experience making and update for the config), so step times and throughput respond to the system
  knobs; the run itself takes ``FAKE_MARTI_STEP_S`` real seconds per step (default 0.05). The reward responds
  to the learning knobs (lr, KL, temperature, n, rounds, reward shaping).
* Steps per episode: ``FAKE_MARTI_PROMPTS`` (default 100000) // rollout_batch_size, times ``--num_episodes``;
  then it exits 0, as MARTI does when its data runs out.
* ``FAKE_MARTI_MODE``: ``normal``; ``oom_at_3`` (the actor's CUDA OOM inside a Ray task at step 3, exit 1);
  ``oom_hang`` (the same text, then the driver hangs); ``crash`` (RuntimeError after step 2, exit 1); ``hang``
  (stops logging after step 2). ``FAKE_MARTI_IGNORE_SIGTERM=1`` ignores SIGTERM. A config whose modelled
  peak memory exceeds ``FAKE_MARTI_CAPACITY_GB`` (default 80) dies with CUDA OOM at step 1.
"""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import time
from datetime import datetime, timedelta

from mart.trial_runner.marti.prevalidate import parse_argv

PID = os.getpid()
SOURCE = "MATH"


class Clock:
    """MARTI's log lines, stamped with a simulated clock (1 s resolution, as MARTI's logger prints)."""

    def __init__(self) -> None:
        self.now = datetime.now()

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def log(self, level: str, line: int, message: str) -> None:
        stamp = self.now.strftime("%m-%d %H:%M:%S")
        print(f"(MultiAgent_PPOTrainer pid={PID}) {level} {stamp} multi_agent_ppotrainer.py:{line}] {message}",
              flush=True)


def fail(exc: BaseException, where: str) -> int:
    print("Traceback (most recent call last):", file=sys.stderr)
    print(f'  File "marti/cli/multi_agent_train_ppo_ray.py", line 770, in {where}', file=sys.stderr)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return 1


def resolve_agents(args) -> list[tuple[str, dict]]:
    """MARTI's post-parse loop: agent keys, then --default_agent's, then the global flags (and its asserts)."""
    agents = []
    for agent_dict in args.agents:
        for agent_id, cfg in agent_dict.items():
            for key, value in args.default_agent.items():
                cfg.setdefault(key, value)
            for key, value in vars(args).items():
                if key not in ("default_agent", "workflow_args"):
                    cfg.setdefault(key, value)
            if cfg["advantage_estimator"] in ("rloo", "reinforce_baseline", "group_norm"):
                assert cfg["n_samples_per_prompt"] > 1 or args.workflow_args.get("max_num_nodes", -1) > 1, \
                    f"{cfg['advantage_estimator']} requires n_samples_per_prompt > 1"
            if cfg.get("packing_samples"):
                assert (cfg.get("vllm_num_engines") or 0) > 0, \
                    f"Only support `packing_samples` with vLLM for agent {agent_id}."
            if cfg.get("vllm_enable_sleep") and not cfg.get("colocate_all_models"):
                print(f"Set vllm_enable_sleep to False when colocate_all_models is disabled for agent {agent_id}.")
                cfg["vllm_enable_sleep"] = False
            agents.append((agent_id, cfg))
    return agents


def check_layout(agents: list[tuple[str, dict]]) -> None:
    """The asserts of MARTI's train()/init_agent on each agent's GPU layout."""
    for _, cfg in agents:
        engines = cfg.get("vllm_num_engines") or 0
        actor = cfg["actor_num_nodes"] * cfg["actor_num_gpus_per_node"]
        if cfg.get("is_tuning") and (cfg.get("colocate_actor_ref") or cfg.get("colocate_all_models")):
            assert (cfg["actor_num_nodes"] == cfg["ref_num_nodes"]
                    and cfg["actor_num_gpus_per_node"] == cfg["ref_num_gpus_per_node"]), \
                "num_nodes and num_gpus_per_node must be the same when colocate actor and ref model."
        if engines > 0 and cfg.get("colocate_all_models"):
            assert actor == engines * cfg["vllm_tensor_parallel_size"], (
                f"actor_num_nodes * actor_num_gpus_per_node must be equal to vllm_num_engines * "
                f"vllm_tensor_parallel_size, got {actor} and {engines * cfg['vllm_tensor_parallel_size']}")


class Model:
    """A deliberately simple cost/quality model of one multi-agent step (numbers of a plausible shape)."""

    def __init__(self, args, agents: list[tuple[str, dict]]) -> None:
        self.args = args
        self.agents = agents
        self.rounds = int(args.workflow_args.get("num_rounds", 1) or 1)
        self.capacity = float(os.environ.get("FAKE_MARTI_CAPACITY_GB", "80"))
        self.tasks = int(os.environ.get("OPENRLHF_ASYNC_NUM_TASKS", "128"))
        self.params_b = float(os.environ.get("FAKE_MARTI_PARAMS_B", "1.5"))

    def peak_memory_gb(self, cfg: dict) -> float:
        train = 16 * self.params_b / max(1, cfg["actor_num_gpus_per_node"] * cfg["actor_num_nodes"])
        if self.args.zero_stage < 3:
            train += 2 * self.params_b
        if self.args.adam_offload:
            train -= 8 * self.params_b / max(1, cfg["actor_num_gpus_per_node"])
        act = self.args.micro_train_batch_size * (self.args.prompt_max_len + cfg["generate_max_len"]) * \
            self.params_b * (0.00004 if self.args.gradient_checkpointing else 0.0004)
        vllm = cfg["vllm_gpu_memory_utilization"] * self.capacity
        if cfg.get("colocate_all_models"):
            if cfg.get("vllm_enable_sleep") and self.args.deepspeed_enable_sleep:
                return max(vllm, train + act)
            return vllm + train + act
        return max(vllm, train + act)

    def step_times(self, step: int, rng: random.Random) -> tuple[float, float, float, dict]:
        """(gen s, make_experience s, update s, status template) of one step."""
        args = self.args
        samples = args.rollout_batch_size * args.n_samples_per_prompt * self.rounds
        gen = make = update = 0.0
        resp = min(1024.0, 300 + 10 * step + rng.uniform(-10, 10))
        for _, cfg in self.agents:
            engines = max(1, cfg.get("vllm_num_engines") or 1)
            kv = max(0.5, cfg["vllm_gpu_memory_utilization"] * self.capacity - 2 * self.params_b)
            concurrency = max(1.0, min(self.tasks / engines, kv * 4))
            rate = 40.0 * cfg["vllm_tensor_parallel_size"] ** 0.5 * (0.8 if cfg.get("enforce_eager") else 1.0)
            gen = max(gen, samples * resp / (engines * concurrency * rate) + 2.0)
            tokens = samples * (resp + 200)
            gpus = cfg["actor_num_nodes"] * cfg["actor_num_gpus_per_node"]
            make += tokens * self.params_b * 2e9 / (gpus * 300e12 * 0.3)
            eff = min(1.0, args.micro_train_batch_size / 8) ** 0.3
            update += 3 * tokens * self.params_b * 2e9 / (gpus * 300e12 * 0.3 * eff) * (
                1.3 if args.gradient_checkpointing else 1.0) + 1.5
        return gen, make, update, {"response_length": resp, "total_length": resp + 200.0}

    def reward(self, step: int, cfg: dict, rng: random.Random) -> float:
        args = self.args
        q = math.exp(-((math.log10(args.actor_learning_rate) + 6.0) ** 2) / 0.8)
        q *= 1.0 / (1.0 + 20 * args.init_kl_coef) if args.use_kl_loss else 1.0
        q *= math.exp(-((float(cfg["temperature"]) - 0.9) ** 2) / 0.5) * min(1.0, 0.6 + 0.1 * args.n_samples_per_prompt)
        q *= 1.0 + 0.05 * min(self.rounds, 4)
        if args.reward_alloc.get("name"):
            q *= 1.0 + 0.1 * min(1.0, float(args.reward_alloc.get("alpha", 0.5)))
        return 0.2 + 0.5 * q * (1 - math.exp(-step / 8.0)) + rng.uniform(-0.01, 0.01)


def main(argv: list[str]) -> int:
    if os.environ.get("FAKE_MARTI_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        args = parse_argv(argv)
    except ValueError as e:
        print("usage: multi_agent_train_ppo_ray.py [-h] --agents AGENTS [AGENTS ...] ...", file=sys.stderr)
        print(f"multi_agent_train_ppo_ray.py: error: {e}", file=sys.stderr, flush=True)
        return 2
    if args.vllm_num_engines is None:
        args.vllm_num_engines = 0
    try:
        assert (args.n_samples_per_prompt * args.rollout_batch_size // args.micro_rollout_batch_size
                >= args.actor_num_nodes * args.actor_num_gpus_per_node // args.ring_attn_size
                // args.ds_tensor_parallel_size), \
            "The number of sample batches must be greater than or equal to the effective number of actor processes."
        agents = resolve_agents(args)
        check_layout(agents)
        assert args.micro_rollout_batch_size == 1, "micro_rollout_batch_size must be 1."
    except AssertionError as e:
        return fail(e, "<module>")
    mode = os.environ.get("FAKE_MARTI_MODE", "normal")
    step_s = float(os.environ.get("FAKE_MARTI_STEP_S", "0.05"))
    prompts = int(os.environ.get("FAKE_MARTI_PROMPTS", "100000"))
    print(f"Started a local Ray instance. View the dashboard at 127.0.0.1:8265 (pid={PID})", flush=True)
    clock = Clock()
    model = Model(args, agents)
    rng = random.Random(args.seed)
    tuned = [(int(aid) if str(aid).isdigit() else n, cfg) for n, (aid, cfg) in enumerate(agents) if cfg.get("is_tuning")]
    if args.eval_before_training and args.eval_dataset:
        clock.log("INFO", 440, f"✨ Evaluation completed, global_step 0, eval_metrics: {evaluation(model, 0, rng)}")
    if not args.dynamic_filtering_for_agents:
        print("fake marti: without --dynamic_filtering_for_agents no agent trains at this MARTI commit", flush=True)
    steps_per_episode = max(1, prompts // args.rollout_batch_size)
    step = 0
    for _episode in range(args.num_episodes):
        for _ in range(steps_per_episode):
            step += 1
            time.sleep(step_s)
            gen, make, update, lengths = model.step_times(step, rng)
            clock.log("INFO", 159, "[MultiAgent_PPOTrainer] Begin ROLLOUT")
            clock.advance(gen)
            clock.log("INFO", 165, "[MultiAgent_PPOTrainer] ROLLOUT FINISHED! Begin making experiences")
            clock.advance(make)
            clock.log("INFO", 245, "[MultiAgent_PPOTrainer] make_experience FINISHED! Begin Training")
            peak = max(model.peak_memory_gb(cfg) for _, cfg in agents)
            if peak > model.capacity or (mode in ("oom_at_3", "oom_hang") and step == 3):
                print(f"(PolicyModelActor pid={PID + 1}) Traceback (most recent call last):", flush=True)
                print(f'(PolicyModelActor pid={PID + 1})   File "marti/trainer/ray/ppo_actor.py", line 192, in '
                      "ppo_train", flush=True)
                print(f"(PolicyModelActor pid={PID + 1}) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                      f"2.00 GiB. GPU 0 has a total capacity of {model.capacity:.2f} GiB of which 0.9 GiB is free.",
                      flush=True)
                while mode == "oom_hang":  # the trainer waits on the dead actor's ray.get forever
                    time.sleep(3600)
                print("ray.exceptions.RayTaskError(OutOfMemoryError): ray::PolicyModelActor.fit() "
                      f"(pid={PID + 1}, ip=127.0.0.1)", file=sys.stderr, flush=True)
                return 1
            clock.advance(update)
            if args.dynamic_filtering_for_agents:
                for i, cfg in tuned:
                    r = model.reward(step, cfg, rng)
                    status = {"policy_loss": rng.gauss(0.0, 0.02), "actor_lr": args.actor_learning_rate,
                              "ppo_clip_ratio": 0.002, "ppo_kl": 0.0004 * step, "vllm_kl": 0.001,
                              "response_length": lengths["response_length"], "total_length": lengths["total_length"],
                              "response_clip_ratio": 0.0, "agent_id": float(i), "reward": r,
                              "kl": 0.001 * step if args.use_kl_loss else 0.0, "return": r}
                    if args.entropy_loss_coef is not None:
                        status["entropy_loss"] = max(0.05, 1.2 * math.exp(-step * args.actor_learning_rate / 4e-5))
                    clock.log("WARNING", 262, f"✨ Global step {step}: {status}")
            if args.eval_dataset and args.eval_steps > 0 and step % args.eval_steps == 0:
                clock.advance(5.0)
                clock.log("INFO", 601, f"✨ Evaluation completed, global_step {step}, "
                                       f"eval_metrics: {evaluation(model, step, rng)}")
            if mode == "crash" and step == 2:
                print("Traceback (most recent call last):", file=sys.stderr)
                print("RuntimeError: fake marti: a Ray actor died (simulated crash after step 2)", file=sys.stderr,
                      flush=True)
                return 1
            if mode == "hang" and step == 2:
                print("fake marti: hanging (simulated stuck collective)", flush=True)
                while True:
                    time.sleep(3600)
    return 0


def evaluation(model: Model, step: int, rng: random.Random) -> dict:
    """The last agent's eval dict, as MARTI prints it without wandb."""
    aid, cfg = model.agents[-1]
    q = model.reward(max(step, 0), cfg, rng) - 0.02
    n = model.args.eval_n_samples_per_prompt
    out = {f"eval_agent{aid}_{SOURCE}_pass1": q}
    if n > 1:
        out = {f"eval_agent{aid}_{SOURCE}_pass{n}": min(1.0, q + 0.15), **out}
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
