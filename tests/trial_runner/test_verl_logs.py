"""verl console lines as a metric source, and failure classification from exit codes and logs."""

from __future__ import annotations

import math

import pytest

from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.objectives import peak_memory_gb
from mart.trial_runner.verl.logs import (
    ConsoleMetricsTail,
    FallbackMetricsTail,
    classify_exit,
    find_oom,
    parse_console_line,
)


def test_console_line_with_numpy_reprs_and_ray_prefix():
    line = ("\x1b[36m(TaskRunnerV1 pid=4242, ip=10.0.0.3)\x1b[0m step:7 - actor/pg_loss:np.float64(-0.0125) - "
            "perf/throughput:np.float64(1534.2) - training/global_step:np.int64(7) - actor/grad_norm:nan - "
            "actor/entropy:np.float32(nan) - note:some text - val-core/openai/gsm8k/reward/mean@1:0.61")
    rec = parse_console_line(line)
    assert rec.step == 7
    assert rec.data["actor/pg_loss"] == -0.0125 and rec.data["perf/throughput"] == 1534.2
    assert rec.data["training/global_step"] == 7.0
    assert math.isnan(rec.data["actor/grad_norm"]) and math.isnan(rec.data["actor/entropy"])
    assert "note" not in rec.data
    assert rec.data["val-core/openai/gsm8k/reward/mean@1"] == 0.61


@pytest.mark.parametrize("line", ["", "Training Progress: 10%", "(pid=1) INFO worker started", "mystep:3 - a:1"])
def test_non_metric_lines_are_ignored(line):
    assert parse_console_line(line) is None


def test_console_tail_reads_complete_lines_once(tmp_path):
    log = tmp_path / "trial.log"
    log.write_text("boot\nstep:1 - a:np.float64(1.0)\nstep:2 - a:np.fl")
    tail = ConsoleMetricsTail(log)
    assert [r.step for r in tail.read_new()] == [1]
    with open(log, "a") as f:
        f.write("oat64(2.0)\n")
    recs = tail.read_new()
    assert [(r.step, r.data["a"]) for r in recs] == [(2, 2.0)]
    assert tail.read_new() == []


def test_fallback_prefers_the_jsonl_file_once_it_exists(tmp_path):
    log, jsonl = tmp_path / "trial.log", tmp_path / "m.jsonl"
    log.write_text("step:0 - v:np.float64(0.1)\nstep:1 - a:np.float64(1.0)\n")
    tail = FallbackMetricsTail(jsonl, log)
    assert [r.step for r in tail.read_new()] == [0, 1] and tail.source == "console"
    jsonl.write_text('{"step": 1, "data": {"a": 1.0}}\n{"step": 2, "data": {"a": null}}\n')
    recs = tail.read_new()
    assert tail.source == "jsonl" and [r.step for r in recs] == [2] and math.isnan(recs[0].data["a"])


def test_both_memory_metric_names_count():
    recs = [StepRecord(1, {"perf/max_memory_allocated_gb": 30.0}), StepRecord(2, {"actor/perf/max_memory_allocated_gb": 41.5})]
    assert peak_memory_gb(recs) == 41.5


@pytest.mark.parametrize(
    "text, expected",
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "torch OutOfMemoryError"),
        ("RuntimeError: CUDA error: out of memory", "CUDA error: out of memory"),
        ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
         "vLLM: no memory left"),
        ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be "
         "stored in KV cache (2048).", "vLLM: KV cache too small"),
        ("ValueError: To serve at least one request with the models's max seq len (32768), (4.5 GiB KV cache is "
         "needed, which is larger than the available KV cache memory (2.1 GiB).", "vLLM: KV cache too small"),
        ("ValueError: Free memory on device (10.1/79.2 GiB) on startup is less than desired GPU memory "
         "utilization (0.9, 71.3 GiB).", "not enough free GPU memory"),
        ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.", "host memory"),
    ],
)
def test_oom_patterns(text, expected):
    assert expected in find_oom(f"(WorkerDict pid=12) {text}\n")
    out = classify_exit(1, f"Traceback\n{text}\n", 2, 5)
    assert out.status is TrialStatus.OOM


def test_classify_exit_paths():
    assert classify_exit(0, "", 5, 5).status is TrialStatus.COMPLETED
    short = classify_exit(0, "", 3, 5)
    assert short.status is TrialStatus.FAILED and "after step 3 of 5" in short.reason
    crash = classify_exit(1, "Traceback (most recent call last):\n  File x\nValueError: Total available GPUs 0 is less "
                             "than total desired GPUs 8\n", 0, 5)
    assert crash.status is TrialStatus.FAILED and crash.reason.startswith("exit code 1: ValueError: Total available GPUs")
    killed = classify_exit(-9, "", 2, 5)
    assert killed.status is TrialStatus.FAILED and "SIGKILL" in killed.reason
    assert classify_exit(None, "", 5, 5).status is TrialStatus.COMPLETED
    assert "exit code 137 (SIGKILL)" in classify_exit(137, "", 1, 5).reason
    assert find_oom("all good\nstep:1 - a:1\n") is None
    # OOM text in a run that still finished every step (a recovered warning) does not make it an OOM
    assert classify_exit(0, "WARNING: CUDA out of memory during graph capture, retrying\n", 5, 5).status \
        is TrialStatus.COMPLETED


# ------------------------------------------------------------------ log shapes seen in real verl runs under Ray


def test_tensor_reprs_are_read_as_numbers():
    line = ("(TaskRunner pid=123) step:4 - actor/entropy:tensor(0.5, device='cuda:0') - "
            "actor/grad_norm:tensor(12.25, device='cuda:0', dtype=torch.float64) - "
            "actor/pg_loss:tensor(-0.03125) - critic/score/mean:tensor(nan, device='cuda:0')")
    rec = parse_console_line(line)
    assert rec.step == 4
    assert rec.data["actor/entropy"] == 0.5
    assert rec.data["actor/grad_norm"] == 12.25
    assert rec.data["actor/pg_loss"] == -0.03125
    assert math.isnan(rec.data["critic/score/mean"])


RAY_TRACEBACK = """\
(TaskRunner pid=123) Traceback (most recent call last):
(TaskRunner pid=123)   File "/usr/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 42, in run
(TaskRunner pid=123)     trainer.fit()
(TaskRunner pid=123) ValueError: boom
"""


def test_ray_prefixed_traceback_names_the_error():
    out = classify_exit(1, "step:1 - a:np.float64(1.0)\n" + RAY_TRACEBACK, 1, 5)
    assert out.status is TrialStatus.FAILED
    assert out.reason == "exit code 1: ValueError: boom"
    coloured = RAY_TRACEBACK.replace("(TaskRunner pid=123)", "\x1b[36m(TaskRunner pid=123, ip=10.0.0.7)\x1b[0m")
    assert classify_exit(1, coloured, 1, 5).reason == "exit code 1: ValueError: boom"


def test_ray_prefixed_oom_is_an_oom_without_the_prefix():
    text = ("(WorkerDict pid=4567, ip=10.0.0.7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.2 GiB is free.\n"
            "(TaskRunner pid=123) ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.update_actor()\n")
    out = classify_exit(1, text, 3, 5)
    assert out.status is TrialStatus.OOM
    assert out.reason.startswith("torch OutOfMemoryError (GPU memory): torch.OutOfMemoryError: CUDA out of memory")
    assert "pid=" not in out.reason


def test_final_console_line_without_newline_is_read_after_exit(tmp_path):
    from mart.state.trials import TrialHandle
    from mart.trial_runner.base import write_status
    from mart.trial_runner.verl import VerlBackend

    trial_dir = tmp_path / "t1"
    trial_dir.mkdir()
    (trial_dir / "trial.log").write_text("boot\nstep:1 - a:np.float64(1.0)\nstep:2 - a:np.float64(2.0)")
    write_status(trial_dir, TrialStatus.COMPLETED, None, 2)
    runner = VerlBackend(prevalidate=False).make_runner()
    handle = TrialHandle(trial_id="t1", backend="verl", trial_dir=str(trial_dir),
                         extra={"metrics_path": str(tmp_path / "nowhere.jsonl")})
    recs = runner.read_all_metrics(handle)
    assert [(r.step, r.data["a"]) for r in recs] == [(1, 1.0), (2, 2.0)]


def test_last_error_line_behind_ray_and_torch_rank_prefixes():
    from mart.trial_runner.verl.logs import last_error_line

    log = "\n".join([
        "(TaskRunner pid=123) step:3 - actor/entropy:0.5",
        "(WorkerDict pid=9, ip=10.0.0.1) [rank3]: Traceback (most recent call last):",
        "\x1b[36m(WorkerDict pid=9, ip=10.0.0.1)\x1b[0m [rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried",
    ])
    assert last_error_line(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried"
    assert last_error_line("[rank0]:ValueError: bad batch") == "ValueError: bad batch"
