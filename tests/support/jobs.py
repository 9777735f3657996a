"""A published job for the job-model tests: Qwen3-8B (its config.json, huggingface.co/Qwen/Qwen3-8B) on 8 GPUs."""

from __future__ import annotations

from mart.state.job import Hardware, JobDescription, ModelShape, Workload
from mart.trial_runner.verl.space import SEARCH_SPACE

R = "actor_rollout_ref.rollout."
QWEN3_8B = ModelShape(num_hidden_layers=36, hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, params=8.19e9)


def job(memory_gb: float = 80.0, shape: ModelShape = QWEN3_8B, nnodes: int = 1) -> JobDescription:
    return JobDescription(
        model=shape, hardware=Hardware(name="H100", memory_gb=memory_gb, bf16_flops=989e12, hbm_bandwidth=3.35e12),
        nnodes=nnodes, gpus_per_node=8,
        workload=Workload(train_batch_size=256, rollout_n=8, max_prompt_length=1024, max_response_length=2048,
                          prompt_length_mean=250, response_length_mean=900))


def base_config() -> dict:
    cfg = SEARCH_SPACE.defaults()
    cfg.update({"algorithm.adv_estimator": "grpo", "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1,
                "data.train_batch_size": 256, "data.max_prompt_length": 1024, "data.max_response_length": 2048,
                R + "n": 8})
    return cfg
