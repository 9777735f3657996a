"""A tiny real verl GRPO job, built offline: model, tokenizer, gsm8k-format data, a dense reward, a base config.

    python -m tests.support.verl_cpu.job OUT      # from the repository root, in the venv of scripts/verl_cpu_env.sh

writes ``OUT/model`` (a random-init Qwen2, 2 layers, hidden 64, two heads of dim 32: vLLM-CPU's attention takes
head sizes of 32 and up), ``OUT/data/{train,test}.parquet`` (verl's gsm8k layout), ``OUT/reward.py`` (dense, so that
GRPO's advantages and gradients are not all zero with a random model), ``OUT/base.yaml`` (the base config for
``mart tune --backend verl``) and ``OUT/env.sh`` (the environment the run needs), and prints the command to try.
Nothing is downloaded: the tokenizer is a byte-level BPE trained here on generated text.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parent / "plugin"
PLUGIN_MODULE = "mart_verl_cpu"
#: what the score reads: verl names it val-core/<data_source>/<metric>/mean@N
DATA_SOURCE = "openai/gsm8k"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

REWARD_SOURCE = '''"""Dense reward for a random model: the share of digits in the answer, plus 1 for gsm8k's exact answer.

gsm8k's own 0/1 score is always 0 for a random model, and then every GRPO advantage (and gradient) is 0.
"""
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    text = solution_str or ""
    digits = sum(c.isdigit() for c in text) / max(len(text), 1)
    found = re.findall(r"#### (\\-?[0-9\\.\\,]+)", text)
    exact = 1.0 if found and found[-1].replace(",", "") == str(ground_truth) else 0.0
    return digits + exact
'''


@dataclass(frozen=True)
class TinyJob:
    root: Path
    model: Path
    train: Path
    test: Path
    reward: Path
    base_config: Path
    ray_tmp: Path

    def env(self) -> dict[str, str]:
        return verl_cpu_env(self.ray_tmp)


def verl_cpu_env(ray_tmp: Path | None = None) -> dict[str, str]:
    """The environment a verl run on the CPU needs (added to the caller's)."""
    path = os.environ.get("PYTHONPATH", "")
    env = {
        # the platform module, imported by verl/__init__.py in every verl process (driver, Ray workers, vLLM)
        "PYTHONPATH": f"{PLUGIN_DIR}{os.pathsep + path if path else ''}",
        "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
        "VERL_PLATFORM": "cpu",
        # verl registers its FSDP engine for cuda/npu only; only the engine lookup reads this (placement follows
        # the platform)
        "VERL_ENGINE_DEVICE": "cuda",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",  # else Ray writes a token to ~/.ray on its first local start
        "RAY_COLOR_PREFIX": "0",
        # Ray starts one idle Python worker per declared CPU when the driver connects: 16 workers of ~0.6 GB that
        # nothing uses here (the CPUs are bookkeeping), and minutes of start-up on 2 cores
        "RAY_prestart_worker_first_driver": "0",
    }
    return env


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = ["what", "is", "the", "sum", "of", "and", "answer", "step", "think", "total", "left", "has", "apples",
             "Natalia", "sold", "clips", "friends", "how", "many", "each", "day", "so", "then", "final", "####"]
    lines = []
    for _ in range(400):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(" ".join(rng.choice(words) for _ in range(8)) + f" {a} + {b} = {a + b} #### {a + b}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def _model(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(out)
    vocab = ((len(tok) + 63) // 64) * 64
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=32768,
                      tie_word_embeddings=True, eos_token_id=eos, pad_token_id=pad, bos_token_id=pad,
                      torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad).save_pretrained(out)


def _rows(n: int, split: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        question = f"what is the sum of {a} and {b}?"
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question + " Let's think step by step and output the final "
                        "answer after \"####\"."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i, "answer": f"{a} + {b} = {a + b} #### {a + b}",
                           "question": question},
        })
    return rows


def base_config(job: TinyJob) -> dict:
    """mart's base config for the tiny job (verl keys; mart adds Hydra's ``+`` where verl's yaml lacks a key)."""
    aro = "actor_rollout_ref"
    return {
        "data.train_files": str(job.train),
        "data.val_files": str(job.test),
        "data.train_batch_size": 4,
        "data.max_prompt_length": 128,
        "data.max_response_length": 16,
        "data.filter_overlong_prompts": True,
        "data.dataloader_num_workers": 0,
        f"{aro}.model.path": str(job.model),
        f"{aro}.model.use_remove_padding": False,
        f"{aro}.model.enable_gradient_checkpointing": False,
        f"{aro}.model.override_config.attn_implementation": "sdpa",
        f"{aro}.actor.strategy": "fsdp2",
        f"{aro}.actor.optim.lr": 1e-3,
        f"{aro}.actor.ppo_mini_batch_size": 4,
        f"{aro}.actor.ppo_micro_batch_size_per_gpu": 8,
        f"{aro}.actor.use_kl_loss": False,
        f"{aro}.actor.entropy_coeff": 0,
        f"{aro}.rollout.name": "vllm",
        f"{aro}.rollout.n": 2,
        f"{aro}.rollout.tensor_model_parallel_size": 1,
        f"{aro}.rollout.log_prob_micro_batch_size_per_gpu": 8,
        f"{aro}.rollout.enforce_eager": True,
        # vLLM-CPU has no sleep mode (verl's default is on)
        f"{aro}.rollout.enable_sleep_mode": False,
        f"{aro}.rollout.free_cache_engine": False,
        f"{aro}.rollout.max_num_seqs": 16,
        f"{aro}.rollout.max_num_batched_tokens": 1024,
        f"{aro}.rollout.val_kwargs.do_sample": False,
        # one agent-loop and one reward worker (verl's default is 8 of each: a Ray actor, ~0.5 GB, apiece)
        f"{aro}.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "reward.custom_reward_function.path": str(job.reward),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.device": "cpu",
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 1,
        "trainer.critic_warmup": 0,
        "ray_kwargs.ray_init.num_gpus": 1,
        # Ray's CPUs are bookkeeping here; TransferQueue takes one per storage unit plus one for its controller
        "ray_kwargs.ray_init.num_cpus": 16,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        # a Ray cluster of its own (else ray.init joins whatever Ray's default temp dir names); short, as AF_UNIX
        # socket paths are limited to 107 bytes
        "ray_kwargs.ray_init._temp_dir": str(job.ray_tmp),
        "ray_kwargs.ray_init.include_dashboard": False,
    }


def build(root: Path, ray_tmp: Path | None = None) -> TinyJob:
    """Build the job under ``root`` (idempotent: an existing complete build is reused)."""
    import pandas as pd
    import yaml

    root = Path(root).resolve()
    if ray_tmp is None:
        ray_tmp = Path(tempfile.mkdtemp(prefix="mray-", dir="/tmp"))
    job = TinyJob(root=root, model=root / "model", train=root / "data" / "train.parquet",
                  test=root / "data" / "test.parquet", reward=root / "reward.py", base_config=root / "base.yaml",
                  ray_tmp=Path(ray_tmp))
    done = root / ".built"
    if not done.exists():
        job.model.mkdir(parents=True, exist_ok=True)
        job.train.parent.mkdir(parents=True, exist_ok=True)
        _tokenizer(job.model)
        _model(job.model)
        pd.DataFrame(_rows(64, "train", 1)).to_parquet(job.train)
        pd.DataFrame(_rows(16, "test", 2)).to_parquet(job.test)
        job.reward.write_text(REWARD_SOURCE)
        done.write_text("ok\n")
    job.ray_tmp.mkdir(parents=True, exist_ok=True)
    job.base_config.write_text(yaml.safe_dump(base_config(job), sort_keys=False))
    env = job.env()
    (root / "env.sh").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    (root / "job.json").write_text(json.dumps({k: str(v) for k, v in job.__dict__.items()}, indent=1))
    return job


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    job = build(Path(argv[0]))
    print(f"built {job.root}\n  source {job.root / 'env.sh'}\n  mart tune --backend verl --base-config "
          f"{job.base_config} --stages system --system-trials 2 --system-horizon 4 --approve auto")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
