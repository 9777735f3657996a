"""verl 0.9.1's own PPO trainer loop on the CPU, with only the GPU parts replaced (needs the verl extra).

    python tests/support/verl_cpu_trainer.py key=value ... [+cpu.KEY=VALUE]

What is verl's here, unchanged: Hydra's parsing of the argv against verl's ``ppo_trainer`` config (the ``+`` rules,
``hydra.run.dir``), ``validate_config``, ``PPOTrainer.__init__`` and ``PPOTrainer.fit`` (the step loop,
``val_before_train``, ``test_freq``, ``save_freq`` and the last step, the ``Tracking`` logger with its console and
file backends), ``_save_checkpoint`` and ``_load_checkpoint`` (``resume_mode``, ``resume_from_path``,
``default_local_dir``, ``latest_checkpointed_iteration.txt``, ``data.pt``) with the FSDP checkpoint manager writing
the actor's shards under ``global_step_N/actor/`` (FSDP on one gloo rank), the ``StatefulDataLoader`` and its
sampler, the lr scheduler, and the algorithm functions: the gsm8k scorer and ``compute_grpo_outcome_advantage``.

What is replaced (no GPU, no Ray, no vLLM, no TransferQueue): the rollout (a tiny Qwen2 from config samples one
answer digit per response, seeded per global step as vLLM's sampling is not part of a checkpoint), the actor
update (one policy-gradient pass per step, optimizer then scheduler step as verl's engine orders them), the
validation (greedy answers on a fixed set) and the metric reduction (a few of verl's names).

``+cpu.*`` keys: ``step_s`` (sleep per step, default 0), ``prompts`` (dataset size, default 256).
Extra metric ``cpu/lr_applied``: the learning rate the step's optimizer update really used (``actor/lr`` is
verl's, the scheduler's value after the step).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from types import SimpleNamespace

import hydra
import numpy as np
import torch
import torch.distributed as dist
import verl.trainer
from omegaconf import DictConfig, OmegaConf, open_dict
from torchdata.stateful_dataloader import StatefulDataLoader
from transfer_queue import KVBatchMeta
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.utils import create_rl_sampler, need_critic, need_reference_policy
from verl.trainer.ppo.v1 import trainer_base
from verl.utils.config import validate_config
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.reward_score import gsm8k

CONFIG_DIR = os.path.join(os.path.dirname(verl.trainer.__file__), "config")
VOCAB = 32  # tokens 0-9 are the digits
SCORE_KEY = "val-core/openai/gsm8k/reward/mean@1"


def _cpu_option(config: DictConfig, key: str, default):
    return OmegaConf.select(config, f"cpu.{key}", default=default)


class _NoTransferQueue:
    """fit() clears the step's TransferQueue partition; there is none here."""

    def kv_clear(self, **kwargs) -> None:
        return None


class _ActorWorkerGroup:
    """The actor worker group's checkpoint calls, in-process: the same arguments reach verl's
    ``FSDPCheckpointManager`` as through the FSDP engine (``workers/engine/fsdp/transformer_impl.py``)."""

    def __init__(self, manager) -> None:
        self.manager = manager

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None, **kwargs):
        self.manager.save_checkpoint(local_path=local_path, hdfs_path=hdfs_path, global_step=global_step,
                                     max_ckpt_to_keep=max_ckpt_to_keep)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False, **kwargs):
        self.manager.load_checkpoint(local_path=local_path, hdfs_path=hdfs_path,
                                     del_local_after_load=del_local_after_load)


def _prompt(i: int) -> dict:
    """Prompt ``i``: two digits whose sum mod 10 is the answer (gsm8k-style ``#### N`` ground truth)."""
    a, b = (i * 7) % 10, (i * 3 + 1) % 10
    return {"input_ids": torch.tensor([a, b]), "ground_truth": str((a + b) % 10), "index": i}


class CpuPPOTrainer(trainer_base.PPOTrainer):
    """verl's PPOTrainer with the worker groups, rollout and update replaced by a tiny in-process model."""

    def _setup(self) -> None:  # replaces tokenizer, datasets, Ray resource pools, workers and LLM servers
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM, Qwen2Config
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from verl.utils.torch_functional import get_constant_schedule_with_warmup

        cfg = self.config
        n_prompts = int(_cpu_option(cfg, "prompts", 256))
        self.train_dataset = [_prompt(i) for i in range(n_prompts)]
        self.val_set = [_prompt(i) for i in range(10_000, 10_032)]
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset, batch_size=cfg.data.train_batch_size, num_workers=0, drop_last=True,
            collate_fn=collate_fn, sampler=create_rl_sampler(cfg.data, self.train_dataset))
        self.train_dataloader_it = None
        self.steps_per_epoch = len(self.train_dataset) // cfg.data.train_batch_size
        total = self.steps_per_epoch * cfg.trainer.total_epochs
        self.total_training_steps = cfg.trainer.total_training_steps or total

        torch.manual_seed(0)  # the base model: the same weights for every trial
        model = AutoModelForCausalLM.from_config(Qwen2Config(
            vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=16, tie_word_embeddings=False))
        self.module = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
        optim = cfg.actor_rollout_ref.actor.optim
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=optim.lr, weight_decay=optim.weight_decay,
                                           betas=tuple(optim.get("betas", (0.9, 0.999))))
        warmup = optim.lr_warmup_steps if optim.lr_warmup_steps > 0 else int(optim.lr_warmup_steps_ratio * total)
        self.lr_scheduler = get_constant_schedule_with_warmup(optimizer=self.optimizer, num_warmup_steps=warmup)
        manager = FSDPCheckpointManager(model=self.module, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler,
                                        processing_class=None, checkpoint_config=cfg.actor_rollout_ref.actor.checkpoint)
        self.actor_rollout_wg = _ActorWorkerGroup(manager)
        self._init_dump_executor()
        self._load_checkpoint()  # verl's, where its own _setup calls it (after the workers exist)

    def on_step_end(self) -> None:
        return None

    def on_sample_end(self) -> None:
        return None

    def _next_batch(self) -> dict:
        if self.train_dataloader_it is None:
            self.train_dataloader_it = iter(self.train_dataloader)
        try:
            return next(self.train_dataloader_it)
        except StopIteration:
            self.train_dataloader_it = iter(self.train_dataloader)
            return next(self.train_dataloader_it)

    def _answer_logits(self, prompts: torch.Tensor) -> torch.Tensor:
        return self.module(input_ids=prompts).logits[:, -1, :10]  # the answer is one digit

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        from verl.utils.debug import marked_timer

        cfg = self.config
        n = cfg.actor_rollout_ref.rollout.n
        with marked_timer("gen", timing_raw):
            batch = self._next_batch()
            prompts = batch["input_ids"].repeat_interleave(n, dim=0)
            truths = [t for t in batch["ground_truth"] for _ in range(n)]
            uids = np.array([i for i in batch["index"].tolist() for _ in range(n)])
            gen = torch.Generator().manual_seed(1000 * int(cfg.data.get("seed") or 0) + self.global_steps)
            with torch.no_grad():
                probs = torch.softmax(self._answer_logits(prompts) / cfg.actor_rollout_ref.rollout.temperature, -1)
                answers = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        with marked_timer("reward", timing_raw):
            scores = torch.tensor([float(gsm8k.compute_score(f"#### {int(a)}", t)) for a, t in zip(answers, truths)])
            token_level_rewards = scores.unsqueeze(-1)  # one response token: the score sits on it
            mask = torch.ones_like(token_level_rewards)
        with marked_timer("adv", timing_raw):
            adv, _ = core_algos.compute_grpo_outcome_advantage(
                token_level_rewards, mask, uids, norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
        with marked_timer("update_actor", timing_raw):
            lr_applied = self.optimizer.param_groups[0]["lr"]
            self.optimizer.zero_grad()
            logp = torch.log_softmax(self._answer_logits(prompts), -1).gather(-1, answers.unsqueeze(-1))
            loss = -(adv * logp).mean()
            loss.backward()
            grad_norm = self.module.clip_grad_norm_(cfg.actor_rollout_ref.actor.optim.clip_grad)
            self.optimizer.step()
            self.lr_scheduler.step()  # once per global step, after the update (verl's engine order)
        time.sleep(float(_cpu_option(cfg, "step_s", 0.0)))
        metrics.update({
            "actor/pg_loss": float(loss.detach()), "actor/grad_norm": float(grad_norm),
            "actor/lr": self.lr_scheduler.get_last_lr()[0], "cpu/lr_applied": lr_applied,
            "actor/entropy": float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean()),
            "critic/score/mean": float(scores.mean()), "critic/advantages/mean": float(adv.mean()),
            "response_length/mean": 1.0, "perf/total_num_tokens": int(prompts.numel() + len(answers)),
        })
        return KVBatchMeta(partition_id="train", keys=[], tags=[])

    def _validate(self) -> dict[str, float]:
        prompts = torch.stack([p["input_ids"] for p in self.val_set])
        with torch.no_grad():
            answers = self._answer_logits(prompts).argmax(-1)
        scores = [gsm8k.compute_score(f"#### {int(a)}", p["ground_truth"]) for a, p in zip(answers, self.val_set)]
        return {SCORE_KEY: float(np.mean(scores))}

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch) -> None:
        metrics.update({f"timing_s/{k}": v for k, v in timing_raw.items()})
        metrics["training/global_step"] = global_steps
        metrics["training/epoch"] = epoch
        metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / max(timing_raw["step"], 1e-9)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@hydra.main(config_path=CONFIG_DIR, config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    with open_dict(config):
        config.transfer_queue.enable = True  # as TaskRunnerV1.run does
    OmegaConf.resolve(config)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    trainer_base.tq = _NoTransferQueue()
    trainer = CpuPPOTrainer(config)
    trainer.init()
    print(f"Total training steps: {trainer.total_training_steps}, resumed at global step {trainer.global_steps}",
          flush=True)
    try:
        trainer.fit(agent_loop_manager=SimpleNamespace())
    finally:
        logger = getattr(trainer, "logger", None)
        if logger is not None:
            logger.finish()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
