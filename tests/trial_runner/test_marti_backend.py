"""MartiBackend: catalogue, MARTI's rules, typed argv (never a shell string, no secrets), the argparse check,
the registry, and ``mart trial`` / ``mart tune --backend marti`` against the MARTI stand-in."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from mart.state.models import TrialStatus
from mart.state.search_space import ConfigError
from mart.trial_runner.base import read_status
from mart.trial_runner.marti._flags import FLAGS, MARTI_COMMIT
from mart.trial_runner.marti.argv import build_argv, build_env, flag_args
from mart.trial_runner.marti.backend import MartiBackend
from mart.trial_runner.marti.prevalidate import check_argv, parse_argv
from mart.trial_runner.marti.runner import MartiRayJobRunner, MartiRunner
from mart.trial_runner.marti.space import MARTI_BASE, job_gpus
from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.registry import load_backend
from tests.support.paths import REPO

FAKE_MARTI = REPO / "tests" / "support" / "fake_marti.py"


def test_flag_table_is_marti_cli_and_pinned():
    assert len(MARTI_COMMIT) == 40
    # a few flags of MARTI's argparse calls, with their shapes (marti/cli/multi_agent_train_ppo_ray.py)
    assert FLAGS["agents"] == {"action": "store", "type": "json", "nargs": "+", "required": True}
    assert FLAGS["colocate_all_models"]["action"] == "store_true"
    assert FLAGS["vllm_gpu_memory_utilization"] == {"action": "store", "type": "float", "default": 0.95}
    assert FLAGS["policy_loss_type"]["choices"] == ["ppo", "gspo"]
    assert FLAGS["adam_betas"]["nargs"] == 2
    assert "use_wandb" in FLAGS and len(FLAGS) > 150


def test_registry_and_base_config_validate():
    b = load_backend("marti", memory_capacity_gb=80.0)
    assert isinstance(b, MartiBackend) and b.name == "marti"
    cfg = b.base_config()
    assert cfg["agents.0.role"] == "generator" and cfg["agents.1.is_tuning"] is True
    assert b.validate_config(cfg) == []
    assert isinstance(b.make_runner(), MartiRunner)
    space = b.search_space()
    keys = {p.key for p in space.params}
    assert {"agents.0.temperature", "agents.1.temperature", "workflow_args.num_rounds", "reward_alloc.alpha",
            "async_num_tasks", "colocate_all_models", "vllm_tensor_parallel_size"} <= keys
    assert "agents.2.temperature" not in keys  # two agents in the baseline
    assert space["vllm_num_engines"].phase == "gen" and space["micro_train_batch_size"].phase == "update_actor"
    assert space["actor_learning_rate"].phase == "learning"


def test_the_number_of_agents_comes_from_the_base_config():
    b = MartiBackend(base_config={"agents.2.role": "verifier", "agents.2.is_tuning": True})
    assert "agents.2.temperature" in b.search_space()
    assert b.validate_config(b.base_config()) == []
    assert job_gpus(b.base_config()) == 3  # colocated: one GPU per tuned agent


def test_marti_rules_are_constraints():
    b = MartiBackend()
    cfg = b.base_config()

    def errors(**changes):
        return b.validate_config({**cfg, **changes})

    # the colocation assert of init_agent: actor GPUs == engines x TP
    assert any("colocate_engines_match_actor" in e for e in errors(vllm_tensor_parallel_size=2))
    assert errors(vllm_tensor_parallel_size=2, actor_num_gpus_per_node=2, ref_num_gpus_per_node=2) == []
    assert any("colocate_actor_ref_shape" in e for e in errors(actor_num_gpus_per_node=2, vllm_num_engines=2))
    assert any("group_estimator_needs_samples" in e for e in errors(n_samples_per_prompt=1))
    assert errors(n_samples_per_prompt=1, advantage_estimator="reinforce") == []
    assert any("micro_rollout_batch_is_1" in e for e in errors(micro_rollout_batch_size=2))
    assert any("agents_are_trained" in e for e in errors(dynamic_filtering_for_agents=False))
    assert any("packing_needs_vllm" in e for e in errors(packing_samples=True, colocate_all_models=False,
                                                          vllm_num_engines=None))
    # per agent: the agent's own key beats the shared flag
    bad_agent = {**cfg, "agents.1.vllm_tensor_parallel_size": 2}
    assert any("agent 1" in e and "colocate" in e for e in b.validate_config(bad_agent))
    # the batch assert after MARTI's parse
    assert any("sample_batches_cover_actor" in e for e in errors(rollout_batch_size=1, n_samples_per_prompt=2,
                                                                 actor_num_gpus_per_node=4, ref_num_gpus_per_node=4,
                                                                 vllm_num_engines=4))


def test_argv_is_typed_whitelisted_and_json_built():
    cfg = MartiBackend().base_config()
    cfg["agents.0.temperature"] = 0.7
    cfg["workflow_args.task"] = 'math", "evil": "x'  # a quote in a value stays inside its JSON string
    cfg["pretrain"] = "--use_wandb=abc"  # a value that looks like a flag stays a value
    argv = build_argv(cfg)
    assert argv[0] == "--agents"
    assert json.loads(argv[1]) == {"0": {"role": "generator", "is_tuning": True, "temperature": 0.7}}
    ns = parse_argv(argv)
    assert ns.workflow_args["task"] == 'math", "evil": "x' and "evil" not in ns.workflow_args
    assert ns.pretrain == "--use_wandb=abc" and ns.use_wandb is None
    assert ns.colocate_all_models is True and ns.gradient_checkpointing is False  # store_true only when true
    assert ns.actor_learning_rate == cfg["actor_learning_rate"]
    assert "--gradient_checkpointing" not in argv
    assert "--dynamic_filtering_for_agents" in argv
    # None leaves a per-agent knob out of the agent's JSON (the shared value holds)
    assert "temperature" not in json.loads(argv[2])["1"]
    assert build_env(cfg) == {"OPENRLHF_ASYNC_NUM_TASKS": "128"}


@pytest.mark.parametrize("key, value, message", [
    ("use_wandb", "0123456789abcdef", "API key"),
    ("tools_config.api_key", "sk-x", "secret"),
    ("agents.0.actor_learning_rate", 1e-6, "does not read"),
    ("agents.1.n_samples_per_prompt", 4, "does not read"),  # only checked per agent; training reads the flag
    ("default_agent.init_kl_coef", 0.01, "does not read"),
    ("no_such_flag", 1, "not a flag"),
    ("micro_train_batch_size", 1.5, "integer"),
    ("policy_loss_type", "dpo", "one of"),
    ("actor_learning_rate", float("nan"), "finite"),
    ("adam_betas", [0.9], "takes 2 values"),
    ("agents", "{}", "JSON flag"),
    ("gradient_checkpointing", "yes", "switch"),
    ("async_num_tasks", 0, "positive"),
    ("agents.x.role", "a", "agents.<index>"),
])
def test_argv_refuses_what_marti_cannot_take(key, value, message):
    cfg = {**MARTI_BASE, key: value}
    with pytest.raises(ConfigError, match=message):
        build_argv(cfg)


def test_relative_workflow_files_become_absolute(tmp_path, monkeypatch):
    (tmp_path / "wf.py").write_text("")
    monkeypatch.chdir(tmp_path)
    b = MartiBackend(base_config={"workflow_func_path": "wf.py", "processor_func_path": "missing.py"})
    assert b.base_config()["workflow_func_path"] == str(tmp_path / "wf.py")
    assert b.base_config()["processor_func_path"] == "missing.py"  # not a file here: left as the user wrote it


def test_backend_refuses_a_secret_in_the_base_config():
    with pytest.raises(ConfigError, match="API key"):
        MartiBackend(base_config={"use_wandb": "key"})


def test_whitelist_refuses_keys_outside_catalogue_and_base():
    b = MartiBackend()
    errs = b.validate_config({**b.base_config(), "max_norm": 0.5})
    assert any("refusing" in e for e in errs)
    b.extend_base({"max_norm": 0.5})
    assert b.validate_config(b.base_config()) == []


def test_prevalidation_uses_marti_flag_table():
    assert check_argv(["--actor_learning_rate=1e-6", "--zero_stage=3"]) == []
    assert "invalid int value" in check_argv(["--zero_stage=x"])[0]
    assert "unrecognized arguments" in check_argv(["--no_such_flag=1"])[0]
    assert "invalid choice" in check_argv(["--kl_estimator=k9"])[0]
    assert check_argv(["--agents", "[1]"])  # not an object
    # the debate example's own command line (examples/multi-agent/run_train_mad.sh), minus paths and the key
    example = shlex.split(
        "--default_agent '{\"is_reasoning_model\": false}' --agents '{\"0\": {\"role\": \"generator\", "
        "\"is_tuning\": true}}' '{\"1\": {\"role\": \"generator\", \"is_tuning\": true}}' --workflow_args "
        "'{\"task\": \"math\", \"num_rounds\": 2}' --reward_alloc '{\"name\": \"margin\", \"alpha\": 0.5}' "
        "--parallel_loading --ref_num_nodes 1 --ref_num_gpus_per_node 1 --actor_num_nodes 1 "
        "--actor_num_gpus_per_node 1 --vllm_num_engines 1 --vllm_tensor_parallel_size 1 --colocate_all_models "
        "--vllm_gpu_memory_utilization 0.6 --micro_train_batch_size 1 --train_batch_size 16 "
        "--micro_rollout_batch_size 1 --rollout_batch_size 16 --n_samples_per_prompt 2 --max_epochs 1 --seed 42 "
        "--prompt_max_len 4096 --generate_max_len 5000 --max_len 30000 --advantage_estimator group_norm "
        "--zero_stage 3 --bf16 --actor_learning_rate 1e-6 --init_kl_coef 1e-3 --use_kl_loss --kl_estimator k3 "
        "--gradient_checkpointing --packing_samples --enforce_eager --vllm_enable_sleep --deepspeed_enable_sleep "
        "--dynamic_filtering_reward_range 0 1 --overlong_buffer_len 2048 --policy_loss_type gspo "
        "--enable_vllm_is_correction --save_steps 20 --eval_steps 20 --num_episodes 2 --input_key=prompt "
        "--load_checkpoint --dynamic_filtering_for_agents")
    assert check_argv(example) == []


def test_ray_address_wraps_the_runner():
    b = MartiBackend(ray_address="127.0.0.1:8265")
    r = b.make_runner()
    assert isinstance(r, MartiRayJobRunner) and isinstance(r.inner, MartiRunner)
    # the job's node runs its own python; the tuner's interpreter path means nothing there
    assert r.inner.gpu_free_threshold_gb is None
    assert r.inner.entrypoint == ["python", "-m", "marti.cli.multi_agent_train_ppo_ray"]


def test_flag_args_forms():
    assert flag_args("zero_stage", 3) == ["--zero_stage=3"]
    assert flag_args("bf16", False) == [] and flag_args("bf16", True) == ["--bf16"]
    assert flag_args("reward_clip_range", [-10, 10]) == ["--reward_clip_range", "-10.0", "10.0"]
    assert flag_args("eval_steps", None) == []
    with pytest.raises(ConfigError, match="start with '-'"):
        flag_args("target_modules", ["--evil"])


def _mart(*args: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mart.graph.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture
def fake_env(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("eval_dataset: data/MATH\n")
    env = dict(os.environ, FAKE_MARTI_STEP_S="0.02", FAKE_MARTI_MODE="normal")
    return base, env


def test_mart_trial_backend_marti_with_the_stand_in(tmp_path, fake_env):
    base, env = fake_env
    out = tmp_path / "trial"
    common = ["trial", "--backend", "marti", "--verl-entrypoint", "python tests/support/fake_marti.py",
              "--base-config", str(base), "--steps", "4"]
    refused = _mart(*common, "--out", str(tmp_path / "refused"), "--set", "vllm_gpu_memory_utilization=1.5", env=env)
    assert refused.returncode == 2 and "vllm_gpu_memory_utilization" in refused.stdout + refused.stderr
    proc = _mart(*common, "--out", str(out), "--set", "agents.1.temperature=0.6", "--set", "async_num_tasks=64",
                 env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert read_status(out).status is TrialStatus.COMPLETED
    recs = MetricsTail(out / "metrics.jsonl").read_new()  # the mirror of the parsed console lines
    assert [r.step for r in recs] == [1, 2, 3, 4]
    assert recs[-1].get("val-core/MATH/pass1") > 0 and recs[-1].get("perf/throughput") > 0
    launch = json.loads((out / "attempt-1" / "launch.json").read_text())
    assert launch["env"]["OPENRLHF_ASYNC_NUM_TASKS"] == "64"
    agents = [json.loads(a) for a in launch["argv"][launch["argv"].index("--agents") + 1:][:2]]
    assert agents[1]["1"]["temperature"] == 0.6 and agents[1]["1"]["ckpt_path"].startswith(str(out.resolve()))
    assert "--eval_steps=4" in launch["argv"] and "--load_checkpoint" not in launch["argv"]


def test_mart_tune_backend_marti_with_the_stand_in(tmp_path, fake_env):
    base, env = fake_env
    proc = _mart("tune", "--backend", "marti", "--verl-entrypoint", "python tests/support/fake_marti.py",
                 "--base-config", str(base), "--approve", "auto", "--system-trials", "2", "--learning-trials", "2",
                 "--system-horizon", "3", "--learning-horizon", "3", "--learning-confirm-trials", "0",
                 "--memory-capacity-gb", "80", "--runs-dir", str(tmp_path / "runs"), "--quiet", "--json", env=env,
                 timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["status"] == "completed", result
    assert result["system"]["baseline_throughput"] > 0 and result["learning"]["baseline_score"] > 0
    assert result["trials"]["total"] >= 4 and result["trials"]["failed"] == 0


def test_run_flags_paths_seed_evaluation_and_no_silent_resume(tmp_path):
    from mart.state.trials import CheckpointRef, TrialSpec

    with pytest.warns(UserWarning, match="set by mart"):
        b = MartiBackend(base_config={"ckpt_path": "/shared/ckpt", "load_checkpoint": True, "eval_steps": 2})
    runner = b.make_runner()
    cfg = b.base_config()
    spec = TrialSpec(trial_id="t1", config=cfg, steps=4, trial_dir=str(tmp_path / "t1"), seed=7, stage="learning")
    argv = runner.build_command(spec)
    ns = parse_argv(argv[argv.index("--agents"):])
    trial = str((tmp_path / "t1").resolve())
    assert ns.ckpt_path.startswith(trial) and not ns.load_checkpoint and ns.seed == 7
    assert ns.eval_steps == 2  # the user's interval divides the horizon: kept
    assert all(a[k].startswith(trial) for obj in ns.agents for a in obj.values() for k in ("ckpt_path", "save_path"))
    system = spec.model_copy(update={"stage": "system", "seed": 0, "trial_dir": str(tmp_path / "t2")})
    ns = parse_argv(runner.build_command(system)[3:])
    assert ns.eval_steps == -1 and not ns.eval_before_training and ns.seed == 42  # MARTI's default seed
    branch = spec.model_copy(update={"init_from": CheckpointRef(path=str(tmp_path / "c"), step=2)})
    with pytest.raises(ConfigError, match="checkpoint"):
        runner.build_command(branch)


def test_gen_flags_reads_argparse_calls_without_running_them():
    from mart.trial_runner.marti.gen_flags import extract

    src = '''
import json, argparse
from datetime import datetime
raise SystemExit("never run")
if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=json.loads, nargs="+", required=True)
    parser.add_argument("--zero_stage", type=int, default=2, help="x")
    parser.add_argument("--max_samples", type=int, default=1e8)
    parser.add_argument("--bf16", action="store_true", default=False)
    parser.add_argument("--enable_ema", action="store_true", help="no default: argparse's False")
    parser.add_argument("--kl_estimator", type=str, default="k1", choices=["k1", "k2", "k3"])
    parser.add_argument("--wandb_run_name", type=str, default="ppo_%s" % datetime.now().strftime("%m%d"))
    parser.add_argument("--pretrain", default=None)
'''
    flags = extract(src)
    assert flags == {
        "agents": {"action": "store", "type": "json", "nargs": "+", "required": True},
        "zero_stage": {"action": "store", "type": "int", "default": 2},
        "max_samples": {"action": "store", "type": "int", "default": 100000000},
        "bf16": {"action": "store_true", "default": False},
        "enable_ema": {"action": "store_true", "default": False},
        "kl_estimator": {"action": "store", "type": "str", "default": "k1", "choices": ["k1", "k2", "k3"]},
        "wandb_run_name": {"action": "store", "type": "str", "default": None},
        "pretrain": {"action": "store", "type": "str", "default": None},
    }
