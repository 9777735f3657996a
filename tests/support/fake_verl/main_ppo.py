"""A stand-in for ``python -m verl.trainer.main_ppo``: verl's CLI shape and output formats, no GPU.

    python tests/support/fake_verl/main_ppo.py key=value ... +new.key=value ... [+fake.mode=MODE]

* Arguments are Hydra overrides. A key that is not in verl's yaml without ``+`` is refused the way Hydra
  refuses it (exit 1), when mart's copy of verl's key list is importable.
* Metrics go to ``$VERL_FILE_LOGGER_PATH`` as verl's file logger writes them (file opened in truncate mode,
  one ``{"step": N, "data": {...}}`` per line, NaN as null) and to stdout as verl's console logger prints
  them (``step:N - key:np.float64(v)``), when ``trainer.logger`` lists ``file`` / ``console``.
* Step 0 is the pre-training validation (unless ``trainer.val_before_train=false``); steps 1..N follow,
  N = ``trainer.total_training_steps``; validation at steps divisible by ``trainer.test_freq`` and at step N,
  only when ``test_freq > 0`` (verl's rule; its default -1 validates before training only).
* The numbers come from a small model of a GRPO step on ``+fake.capacity_gb`` GPUs (default 80 GB) for a
  ``+fake.params_b`` billion-parameter model (default 8): rollout memory share, TP, max_num_seqs, micro
  batches, offload and checkpointing move throughput and memory; lr, KL, entropy, temperature and n move the
  reward. A config whose modelled peak exceeds the capacity dies with CUDA OOM at step 1.
* ``+fake.mode`` (or env ``FAKE_VERL_MODE``): ``normal``; ``oom_at_4`` (torch OOM traceback at step 4,
  exit 1); ``crash`` (RuntimeError after step 2); ``hang`` (stops logging after step 2 and sleeps;
  ``+fake.ignore_sigterm=true`` makes it ignore SIGTERM); ``oom_hang`` (OOM text at step 4, then
  hangs); ``nan`` (NaN losses from step 3); ``truncate``
  (the last step's line is written half, then the process exits 1 as if killed mid-write).
* Checkpoints as verl 0.9.1 writes and reads them (``trainer/ppo/v1/trainer_base.py`` ``_save_checkpoint`` /
  ``_load_checkpoint``, ``utils/checkpoint/fsdp_checkpoint_manager.py``): with ``trainer.save_freq > 0`` a step
  that is a multiple of it, and the last step, writes ``<trainer.default_local_dir>/global_step_N/`` (``actor/``
  with one ``{model,optim,extra_state}_world_size_W_rank_R.pt`` per GPU, ``fsdp_config.json``,
  ``huggingface/config.json``; ``data.pt``), then ``latest_checkpointed_iteration.txt``; the files hold the
  stand-in's state as JSON. ``trainer.resume_mode``: ``disable``; ``auto`` (verl's default: the newest checkpoint
  in ``default_local_dir`` by its tracker file; ``resume_from_path`` is ignored); ``resume_path`` (asserts a str
  containing ``global_step_``, resolves a relative one against the working directory, takes the global step
  from the name; a missing actor shard is a FileNotFoundError). A resumed run validates at that step (with
  ``val_before_train``) and trains the steps after it. ``actor.checkpoint.load_contents`` decides what comes
  back: ``model`` (the training progress), ``optimizer`` (its param groups: the first step after the resume
  runs at the saved lr, as torch restores them), ``extra`` (the lr scheduler: the saved base lr for the whole
  run, and the RNG). ``actor/lr`` is the scheduler's lr.
* The reward follows the training so far: the mean quality of every step's config since step 1 (constant for
  a run without a checkpoint, so such a run's numbers are those of a config alone).
* ``+fake.gate=PATH``: before each step, wait while the file PATH exists (a test holds a run mid-way).
* ``+fake.leak_worker=true`` starts a worker in its own session (as Ray does with actors) that outlives the run
  (by ``+fake.leak_worker_s`` seconds from its start, default 600).
* ``+fake.step_s`` real seconds per step (default 0.05); ``+fake.steps_per_epoch`` (default 1000): with
  ``trainer.total_epochs`` it can end the run early with exit 0, as verl does.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time

DEFAULTS = {
    "data.train_batch_size": 1024, "data.max_prompt_length": 512, "data.max_response_length": 512,
    "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "trainer.total_training_steps": 5,
    "trainer.total_epochs": 30, "trainer.val_before_train": True, "trainer.test_freq": -1,
    "trainer.logger": ["console", "wandb"], "trainer.project_name": "verl_examples", "trainer.experiment_name": "gsm8k",
    "algorithm.adv_estimator": "gae",
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5, "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.max_num_seqs": 256, "actor_rollout_ref.rollout.max_num_batched_tokens": 8192,
    "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.free_cache_engine": True, "actor_rollout_ref.rollout.enforce_eager": False,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None, "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384, "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_epochs": 1, "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.use_kl_loss": False, "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.entropy_coeff": 0.0, "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.ref.fsdp_config.param_offload": False,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "trainer.save_freq": -1, "trainer.resume_mode": "auto", "trainer.resume_from_path": None,
    "trainer.default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
    "trainer.max_actor_ckpt_to_keep": None, "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra"],
    "actor_rollout_ref.actor.checkpoint.load_contents": ["model", "optimizer", "extra"],
    "fake.mode": "normal", "fake.step_s": 0.05, "fake.capacity_gb": 80.0, "fake.params_b": 8.0,
    "fake.steps_per_epoch": 1000, "fake.ignore_sigterm": False, "fake.gate": None, "fake.seed": 0, "fake.leak_worker": False, "fake.leak_worker_s": 600,
}


def parse_value(text: str):
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [parse_value(x.strip()) for x in inner.split(",")] if inner else []
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_args(argv: list[str]) -> dict:
    try:
        from mart.trial_runner.verl._yaml_keys import YAML_KEYS
    except ImportError:
        YAML_KEYS = None
    cfg = dict(DEFAULTS)
    for arg in argv:
        if arg.startswith("--"):
            print(f"fake verl: option {arg} is not supported", file=sys.stderr)
            sys.exit(2)
        plus = arg.startswith("+")
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep:
            print(f"hydra.errors.OverrideParseException: mismatched input '{arg}'", file=sys.stderr)
            sys.exit(1)
        if YAML_KEYS is not None and not plus and not key.startswith("hydra.") and key not in YAML_KEYS:
            print(f"Could not override '{key}'.\nTo append to your config use +{arg}\n"
                  f"Key '{key.split('.')[-1]}' is not in struct", file=sys.stderr)
            sys.exit(1)
        if YAML_KEYS is not None and plus and key in YAML_KEYS:
            print(f"Could not append to config. An item is already at '{key}'.", file=sys.stderr)
            sys.exit(1)
        cfg[key] = parse_value(value)
    mode = os.environ.get("FAKE_VERL_MODE")
    if mode:
        cfg["fake.mode"] = mode
    return cfg


def validate(cfg: dict) -> None:
    """The part of verl's validate_config that concerns batch arithmetic (same messages)."""
    n_gpus = cfg["trainer.n_gpus_per_node"] * cfg["trainer.nnodes"]
    if not cfg["actor_rollout_ref.actor.use_dynamic_bsz"]:
        real = cfg["data.train_batch_size"] * cfg["actor_rollout_ref.rollout.n"]
        assert real % n_gpus == 0, (f"real_train_batch_size ({real}) must be divisible by minimal possible batch "
                                    f"size ({n_gpus})")
        if cfg["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] is None:
            raise ValueError("[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
                             "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.")


class Model:
    """A deliberately simple cost/quality model of one GRPO step (numbers of a plausible shape)."""

    def __init__(self, cfg: dict) -> None:
        g = lambda k: cfg[f"actor_rollout_ref.{k}"]
        self.cfg = cfg
        self.n_gpus = cfg["trainer.n_gpus_per_node"] * cfg["trainer.nnodes"]
        self.params_b = float(cfg["fake.params_b"])
        self.capacity = float(cfg["fake.capacity_gb"])
        self.prompt = cfg["data.max_prompt_length"]
        self.max_resp = cfg["data.max_response_length"]
        self.batch = cfg["data.train_batch_size"] * g("rollout.n")
        self.tp = g("rollout.tensor_model_parallel_size")
        self.mem_util = float(g("rollout.gpu_memory_utilization"))
        self.max_seqs = g("rollout.max_num_seqs")
        micro = g("actor.ppo_micro_batch_size_per_gpu") or 8
        self.micro = 4 if g("actor.use_dynamic_bsz") else micro
        self.ckpt = bool(g("model.enable_gradient_checkpointing"))
        self.param_off = bool(g("actor.fsdp_config.param_offload"))
        self.optim_off = bool(g("actor.fsdp_config.optimizer_offload"))
        self.dyn = bool(g("actor.use_dynamic_bsz"))
        self.lr = float(g("actor.optim.lr"))
        self.use_kl = bool(g("actor.use_kl_loss"))
        self.kl = float(g("actor.kl_loss_coef"))
        self.ent = float(g("actor.entropy_coeff"))
        self.temp = float(g("rollout.temperature"))
        self.n = g("rollout.n")

    def peak_memory_gb(self, resp_len: float) -> float:
        weights = 2 * self.params_b  # bf16
        train_state = 16 * self.params_b / self.n_gpus  # fp32 master + Adam, FSDP-sharded
        if self.param_off:
            train_state -= 4 * self.params_b / self.n_gpus
        if self.optim_off:
            train_state -= 8 * self.params_b / self.n_gpus
        seq = self.prompt + resp_len
        act = self.micro * seq * self.params_b * (0.00004 if self.ckpt else 0.00025)
        if self.dyn:
            act = self.cfg["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] * self.params_b * (
                0.00004 if self.ckpt else 0.00025)
        rollout = self.mem_util * self.capacity
        if not self.cfg["actor_rollout_ref.rollout.free_cache_engine"]:
            return rollout + train_state + act
        return max(rollout + weights / self.tp * 0.2, train_state + act + weights / self.n_gpus)

    def quality(self, lr: float) -> float:
        """How good a step with this config (at learning rate ``lr``) is for the reward, in [0, ~1.3]."""
        q = math.exp(-((math.log10(lr) + 6.0) ** 2) / 0.8)
        q *= 1.0 / (1.0 + 20 * self.kl) if self.use_kl else 1.0
        q *= 1.0 + 30 * self.ent - 3000 * self.ent**2
        return q * math.exp(-((self.temp - 0.9) ** 2) / 0.5) * min(1.0, 0.6 + 0.1 * self.n)

    def step(self, step: int, rng: random.Random, lr: float | None = None, qbar: float | None = None,
             reported_lr: float | None = None) -> dict:
        """One step's metrics; ``lr`` is the rate the update used, ``qbar`` the mean quality trained so far
        (default: this config's own), ``reported_lr`` the scheduler's (``actor/lr``)."""
        lr = self.lr if lr is None else lr
        resp = min(self.max_resp, 180 + 12 * step + rng.uniform(-8, 8))  # lengths drift upward
        seq = self.prompt * 0.5 + resp
        tokens = self.batch * seq
        # rollout: engines x concurrent sequences (bounded by max_num_seqs and by the KV cache) x per-seq rate
        kv_gb = max(0.1, (self.mem_util * self.capacity - 2 * self.params_b / self.tp) * self.tp)
        kv_seqs = kv_gb * 1e9 / (18e3 * self.params_b * (self.prompt + resp))
        concurrency = max(1.0, min(self.max_seqs, kv_seqs))
        engines = self.n_gpus / self.tp
        per_seq_rate = 30.0 * self.tp**0.5 / (1.0 + concurrency / 512.0)  # tokens/s of one sequence
        gen = self.batch * resp / (engines * concurrency * per_seq_rate)
        gen *= 1.0 + 0.5 * resp / self.max_resp  # the longest sample sets the pace
        # forward/backward passes: 2 x params x tokens FLOPs at 400 TFLOP/s x MFU (worse for tiny micro batches)
        eff = 1.0 if self.dyn else min(1.0, self.micro / 32) ** 0.25
        fwd = 2 * self.params_b * 1e9 * tokens / (self.n_gpus * 400e12 * 0.35 * eff)
        old_log_prob = fwd
        ref = fwd * (1.3 if self.cfg["actor_rollout_ref.ref.fsdp_config.param_offload"] else 1.0) if self.use_kl else 0.0
        update = 3 * fwd * (1.33 if self.ckpt else 1.0) * (1.3 if self.optim_off else 1.0) * (
            1.2 if self.param_off else 1.0) * self.cfg["actor_rollout_ref.actor.ppo_epochs"]
        update_weights = 0.5 + self.params_b * 0.05
        total = gen + old_log_prob + ref + update + update_weights + 0.3
        fwd_eff = eff
        peak = self.peak_memory_gb(resp)
        # reward: best near lr=1e-6, hurt by too much KL, some entropy and temperature help exploring
        q = self.quality(lr)
        score = 0.25 + 0.5 * (q if qbar is None else qbar) * (1 - math.exp(-step / 8.0)) + rng.uniform(-0.01, 0.01)
        return {
            "training/global_step": step,
            "actor/pg_loss": rng.gauss(0.0, 0.02),
            "actor/pg_clipfrac": 0.002 + 0.01 * q,
            "actor/ppo_kl": 0.0005 * step * (lr / 1e-6),
            "actor/kl_loss": 0.001 * step if self.use_kl else 0.0,
            "actor/entropy": max(0.05, 1.2 * math.exp(-step * lr / 1e-6 / 40) + 0.5 * self.ent * 100),
            "actor/grad_norm": 0.3 + rng.uniform(0, 0.1),
            "actor/lr": lr if reported_lr is None else reported_lr,
            "critic/score/mean": score, "critic/rewards/mean": score,
            "response_length/mean": resp, "response_length/max": min(self.max_resp, resp * 1.8),
            "response_length/clip_ratio": max(0.0, (resp * 1.8 - self.max_resp) / self.max_resp) if resp * 1.8 > self.max_resp else 0.0,
            "prompt_length/mean": self.prompt * 0.5,
            "timing_s/gen": gen, "timing_s/old_log_prob": old_log_prob, "timing_s/ref": ref, "timing_s/adv": 0.2,
            "timing_s/update_actor": update, "timing_s/update_weights": update_weights, "timing_s/step": total,
            "timing_per_token_ms/gen": 1000 * gen / tokens, "timing_per_token_ms/update_actor": 1000 * update / tokens,
            "perf/total_num_tokens": tokens, "perf/time_per_step": total,
            "perf/throughput": tokens / (total * self.n_gpus), "perf/mfu/actor": 0.3 * fwd_eff,
            "actor/perf/max_memory_allocated_gb": peak, "perf/max_memory_reserved_gb": peak * 1.05,
            "perf/cpu_memory_used_gb": 60.0 + (8 * self.params_b if self.optim_off else 0.0),
        }

    def validation(self, step: int, rng: random.Random, lr: float | None = None, qbar: float | None = None) -> dict:
        q = self.step(max(step, 0), rng, lr, qbar)["critic/score/mean"]
        return {"val-core/openai/gsm8k/reward/mean@1": q - 0.02, "val-aux/openai/gsm8k/score/mean@1": q}


class ResumeError(Exception):
    """What verl raises while resuming (an assert, a missing shard): the run dies before its first log line."""


def _checkpoint_root(cfg: dict) -> str:
    """``trainer.default_local_dir`` with verl's default interpolation resolved, absolute against the cwd."""
    root = str(cfg["trainer.default_local_dir"])
    root = root.replace("${trainer.project_name}", str(cfg["trainer.project_name"]))
    root = root.replace("${trainer.experiment_name}", str(cfg["trainer.experiment_name"]))
    return root if os.path.isabs(root) else os.path.join(os.getcwd(), root)


def _shard(folder: str, kind: str, world: int, rank: int) -> str:
    return os.path.join(folder, "actor", f"{kind}_world_size_{world}_rank_{rank}.pt")


def resume_folder(cfg: dict) -> str | None:
    """The checkpoint folder verl 0.9.1's v1 trainer resumes from (``_load_checkpoint``), or None."""
    mode = cfg["trainer.resume_mode"]
    if mode == "disable":
        return None
    if mode == "auto":  # resume_from_path is not consulted in this mode
        root = _checkpoint_root(cfg)
        tracker = os.path.join(root, "latest_checkpointed_iteration.txt")
        if not os.path.exists(tracker):
            print(f"Checkpoint tracker file does not exist: {tracker}", flush=True)
            return None
        folder = os.path.join(root, f"global_step_{int(open(tracker).read())}")
        return folder if os.path.exists(folder) else None
    if mode == "resume_path":
        path = cfg["trainer.resume_from_path"]
        if not isinstance(path, str):
            raise ResumeError("AssertionError: resume ckpt must be str type")
        if "global_step_" not in path:
            raise ResumeError("AssertionError: resume ckpt must specify the global_steps")
        return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    # verl logs the unknown mode, then reads a variable it never set
    raise ResumeError("UnboundLocalError: cannot access local variable 'global_step_folder' where it is not "
                      f"associated with a value (trainer.resume_mode={mode!r})")


def load_checkpoint(cfg: dict, folder: str, world: int) -> dict:
    """The state a resume brings back, by ``actor.checkpoint.load_contents`` (the FSDP checkpoint manager)."""
    tail = folder.split("global_step_")[-1]
    try:
        step = int(tail)
    except ValueError:
        raise ResumeError(f"ValueError: invalid literal for int() with base 10: {tail!r}") from None
    print(f"Resuming from {folder}, setting global step to {step}", flush=True)
    contents = cfg["actor_rollout_ref.actor.checkpoint.load_contents"] or ["model", "optimizer", "extra"]
    state: dict = {"step": step}
    for kind, key in (("model", "model"), ("optim", "optimizer"), ("extra_state", "extra")):
        if key not in contents:
            continue
        path = _shard(folder, kind, world, 0)
        if not os.path.exists(path):
            raise ResumeError(f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'")
        with open(path) as f:
            state[key] = json.load(f)
    if not os.path.exists(os.path.join(folder, "data.pt")):
        print(f"Warning: No dataloader state found at {os.path.join(folder, 'data.pt')}, will start from scratch",
              flush=True)
    return state


def save_checkpoint(cfg: dict, step: int, world: int, state: dict, saved: list[str]) -> None:
    """``global_step_N/`` as verl writes it, then the tracker file (written last: a resume never sees half)."""
    root = _checkpoint_root(cfg)
    folder = os.path.join(root, f"global_step_{step}")
    print(f"Saving checkpoint to {folder}", flush=True)
    os.makedirs(os.path.join(folder, "actor", "huggingface"), exist_ok=True)
    for rank in range(world):
        for kind, key in (("model", "model"), ("optim", "optimizer"), ("extra_state", "extra")):
            with open(_shard(folder, kind, world, rank), "w") as f:
                json.dump(state[key], f)
    with open(os.path.join(folder, "actor", "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 1, "world_size": world}, f)
    with open(os.path.join(folder, "actor", "huggingface", "config.json"), "w") as f:
        json.dump({"architectures": ["FakeForCausalLM"]}, f)
    with open(os.path.join(folder, "data.pt"), "w") as f:
        json.dump({"batches_consumed": step}, f)
    keep = cfg["trainer.max_actor_ckpt_to_keep"]
    saved.append(os.path.join(folder, "actor"))
    if isinstance(keep, int) and keep > 0:  # the manager removes actor folders it saved itself in this run
        import shutil

        while len(saved) > keep:
            shutil.rmtree(saved.pop(0), ignore_errors=True)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(step))


def console_line(step: int, data: dict) -> str:
    def fmt(v):
        if isinstance(v, bool):
            return repr(v)
        if isinstance(v, int):
            return f"np.int64({v})"
        return f"np.float64({v!r})" if isinstance(v, float) else repr(v)

    return " - ".join([f"step:{step}"] + [f"{k}:{fmt(v)}" for k, v in data.items()])


def main(argv: list[str]) -> int:
    cfg = parse_args(argv)
    mode = cfg["fake.mode"]
    if cfg["fake.ignore_sigterm"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if cfg["fake.leak_worker"]:  # a Ray-actor-like worker in a session of its own: outlives the driver's group
        import subprocess

        worker = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({float(cfg['fake.leak_worker_s'])})"],
                                  start_new_session=True)
        print(f"(WorkerDict pid={worker.pid}) started", flush=True)
    run_dir = cfg.get("hydra.run.dir")
    if run_dir:
        os.makedirs(os.path.join(run_dir, ".hydra"), exist_ok=True)
        with open(os.path.join(run_dir, ".hydra", "overrides.json"), "w") as f:
            json.dump(argv, f)
    try:
        validate(cfg)
    except (AssertionError, ValueError) as e:
        print("Traceback (most recent call last):\n  File \"verl/utils/config.py\", line 95, in validate_config",
              file=sys.stderr)
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1

    model = Model(cfg)
    rng = random.Random(int(cfg["fake.seed"]))
    world = model.n_gpus
    base_lr = first_lr = model.lr  # the scheduler's lr, and the lr of the first update (torch's param groups)
    start, q_sum = 0, 0.0
    try:
        folder = resume_folder(cfg)
        if folder is None:
            print("Training from scratch", flush=True)
        else:
            state = load_checkpoint(cfg, folder, world)
            start = state["step"]
            q_sum = state["model"]["q_sum"] if "model" in state else 0.0
            if "extra" in state:  # the scheduler's state: its base lr wins over the config's, for the whole run
                base_lr = first_lr = state["extra"]["lr_scheduler"]["base_lr"]
                rng.setstate((state["extra"]["rng"][0], tuple(state["extra"]["rng"][1]), state["extra"]["rng"][2]))
            if "optimizer" in state:
                first_lr = state["optimizer"]["param_groups"][0]["lr"]
    except ResumeError as e:
        print("Traceback (most recent call last):\n  File \"verl/trainer/ppo/v1/trainer_base.py\", line 876, in "
              f"_load_checkpoint\n{e}", file=sys.stderr, flush=True)
        return 1

    loggers = cfg["trainer.logger"] if isinstance(cfg["trainer.logger"], list) else [cfg["trainer.logger"]]
    fp = None
    if "file" in loggers:
        path = os.environ.get("VERL_FILE_LOGGER_PATH") or os.path.join(
            cfg["trainer.project_name"], f"{cfg['trainer.experiment_name']}.jsonl")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        print(f"Creating file logger at {os.path.abspath(path)}", flush=True)
        fp = open(path, "wb", buffering=0)  # noqa: SIM115 - verl: truncate mode, unbuffered, open for the run

    def log(step: int, data: dict, *, half: bool = False) -> None:
        if "console" in loggers:
            print(f"(TaskRunnerV1 pid={os.getpid()}) {console_line(step, data)}", flush=True)
        if fp is not None:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}
            line = (json.dumps({"step": step, "data": clean}) + "\n").encode()
            fp.write(line[: len(line) // 2] if half else line)

    horizon = int(cfg["trainer.total_training_steps"])
    max_steps = int(cfg["fake.steps_per_epoch"]) * int(cfg["trainer.total_epochs"])
    step_s = float(cfg["fake.step_s"])
    save_freq = int(cfg["trainer.save_freq"])
    saved: list[str] = []
    print(f"(TaskRunnerV1 pid={os.getpid()}) Total training steps: {horizon}", flush=True)
    if cfg["trainer.val_before_train"]:
        time.sleep(step_s)
        log(start, model.validation(start, rng, base_lr, q_sum / start if start else None))
    test_freq = int(cfg["trainer.test_freq"])
    gate = cfg["fake.gate"]
    for step in range(start + 1, min(horizon, max_steps) + 1):
        while gate and os.path.exists(gate):
            time.sleep(0.05)
        time.sleep(step_s)
        lr = first_lr if step == start + 1 else base_lr
        q_sum += model.quality(lr)
        data = model.step(step, rng, lr, q_sum / step, reported_lr=base_lr)
        if data["actor/perf/max_memory_allocated_gb"] > model.capacity or (mode in ("oom_at_4", "oom_hang") and step == 4):
            print(f"(WorkerDict pid={os.getpid() + 1}) Traceback (most recent call last):", flush=True)
            print(f"(WorkerDict pid={os.getpid() + 1})   File \"verl/workers/actor/dp_actor.py\", line 412, in update_policy",
                  flush=True)
            print(f"(WorkerDict pid={os.getpid() + 1}) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                  f"4.00 GiB. GPU 0 has a total capacity of {model.capacity:.2f} GiB of which 1.2 GiB is free.",
                  flush=True)
            while mode == "oom_hang":  # the driver waits on a dead worker forever (verl issue #4709 style)
                time.sleep(3600)
            return 1
        if mode == "nan" and step >= 3:
            data["actor/pg_loss"] = float("nan")
            data["actor/grad_norm"] = float("nan")
            data["actor/entropy"] = float("nan")
        if save_freq > 0 and (step >= horizon or step % save_freq == 0):  # verl: in the step, before validation
            t0 = time.perf_counter()
            save_checkpoint(cfg, step, world, {
                "model": {"q_sum": q_sum, "global_step": step},
                "optimizer": {"param_groups": [{"lr": base_lr, "weight_decay": cfg["actor_rollout_ref.actor.optim.weight_decay"]}]},
                "extra": {"lr_scheduler": {"base_lr": base_lr}, "rng": rng.getstate()},
            }, saved)
            data["timing_s/save_checkpoint"] = time.perf_counter() - t0
        if test_freq > 0 and (step == horizon or step % test_freq == 0):  # verl: no validation when test_freq <= 0
            data.update(model.validation(step, rng, base_lr, q_sum / step))
        if mode == "truncate" and step == min(horizon, max_steps):
            log(step, data, half=True)
            print("fake verl: killed while writing the last line", file=sys.stderr, flush=True)
            os._exit(1)
        log(step, data)
        if mode == "crash" and step == 2:
            raise RuntimeError("fake verl: worker died (simulated crash after step 2)")
        if mode == "hang" and step == 2:
            print("fake verl: hanging (simulated stuck collective)", flush=True)
            while True:
                time.sleep(3600)
    if fp is not None:
        fp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
