"""Backend.describe_job: what each backend tells the agents' job model (model shape, hardware, cluster, workload)."""

from __future__ import annotations

import json

import pytest

from mart.state.job import ModelShape
from mart.trial_runner.local.backend import DEFAULT_MEMORY_CAPACITY_GB, LocalBackend
from mart.trial_runner.registry import load_backend
from mart.trial_runner.verl.backend import VerlBackend

QWEN3_8B_CONFIG = {  # huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (the fields the model reads)
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 12288, "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
}


def test_sim_describes_its_scenario_as_a_user_would():
    job = load_backend("sim", scenario="qwen3-8b-2x8").describe_job()
    assert (job.nnodes, job.gpus_per_node, job.n_gpus) == (2, 8, 16)
    assert job.model.num_hidden_layers == 36 and job.model.kv_heads == 8
    assert job.hardware.memory_gb == 80.0
    assert job.hardware.hbm_bandwidth == pytest.approx(3.35e12)  # the datasheet figure, not the sim's effective one
    assert job.workload.rollout_n == 8


def test_sim_capacity_override_reaches_the_description():
    assert load_backend("sim", scenario="qwen3-8b-1x8", memory_capacity_gb=40).describe_job().hardware.memory_gb == 40


def test_local_describes_the_tiny_model_on_an_emulated_device():
    job = LocalBackend().describe_job()
    assert job.hardware.cpu and job.engine == "hf"
    assert job.hardware.memory_gb == DEFAULT_MEMORY_CAPACITY_GB
    assert job.model.gated_mlp is False and job.model.vocab_size == 14
    assert 0.5e6 < job.model.n_params < 0.7e6  # the 0.6M-parameter default


def test_verl_reads_config_json_from_the_model_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B_CONFIG))
    b = VerlBackend(prevalidate=False, memory_capacity_gb=80.0, ray_address="127.0.0.1:8265",
                    base_config={"actor_rollout_ref.model.path": str(tmp_path), "trainer.n_gpus_per_node": 8,
                                 "data.max_response_length": 2048})
    job = b.describe_job()
    assert job is not None
    assert job.model.n_params == pytest.approx(8.19e9, rel=0.02)  # counted from the shape: Qwen3-8B has 8.19B
    assert job.workload.max_response_length == 2048 and job.n_gpus == 8
    assert job.workload.rollout_n == 5  # mart's GRPO base


def test_verl_without_a_readable_model_config_is_unknown(tmp_path):
    b = VerlBackend(prevalidate=False, memory_capacity_gb=80.0, ray_address="127.0.0.1:8265",
                    base_config={"actor_rollout_ref.model.path": "Qwen/Qwen3-8B"})
    assert b.describe_job() is None


def test_model_config_errors_name_the_file_and_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="config.json.*num_hidden_layers"):
        ModelShape.from_config_file(tmp_path)


def test_sim_card_without_nvlink_is_described_with_its_pcie_link(tmp_path):
    # L40S: "PCIe Gen4 only (no NVLink)" must not read as NVLink (its TP all-reduces and FSDP gathers cross PCIe)
    from tests.support.paths import REPO

    l40s = load_backend("sim", scenario_file=str(REPO / "examples" / "scenarios" / "qwen2.5-1.5b-1x8-l40s.yaml"))
    assert l40s.describe_job().hardware.intra_node_bandwidth is not None
    h100 = load_backend("sim", scenario="qwen3-8b-1x8").describe_job().hardware
    assert h100.intra_node_bandwidth is None  # NVLink: the model's NVLink prior
    assert l40s.describe_job().hardware.intra_node_bandwidth < 50e9
