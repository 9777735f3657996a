"""``mart trial``: input parsing, refusing bad input before any trial, a foreground run, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mart.state.config_values import parse_value
from mart.trial_runner.trial_command import InputError, parse_sets, read_config_file, run_trial
from tests.support.paths import REPO as REPO_ROOT

REPO = REPO_ROOT
pytestmark = pytest.mark.timeout(180)


def test_set_values_are_parsed_like_yaml_scalars():
    assert parse_value("1e-4") == pytest.approx(1e-4) and isinstance(parse_value("1e-4"), float)
    assert parse_value("3") == 3 and isinstance(parse_value("3"), int)
    assert parse_value("0.5") == 0.5
    assert parse_value("true") is True and parse_value("False") is False
    assert parse_value("null") is None
    assert parse_value("low_var_kl") == "low_var_kl"
    assert parse_sets(["a.b=1", "+c='x=y'"]) == {"a.b": 1, "c": "x=y"}
    with pytest.raises(InputError, match="--set: 'c=x=y'"):  # Hydra's grammar: quote a value holding =
        parse_sets(["c=x=y"])
    with pytest.raises(InputError, match="KEY=VALUE"):
        parse_sets(["data.train_batch_size"])


def test_config_files_yaml_nested_or_json(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-4\ndata.train_batch_size: 8\n")
    assert read_config_file(y) == {"actor_rollout_ref.actor.optim.lr": 1e-4, "data.train_batch_size": 8}
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"seed": 3}))
    assert read_config_file(j) == {"seed": 3}
    (tmp_path / "list.yaml").write_text("- a.b=1\n- +c=x\n")  # a list of overrides, like a base config
    assert read_config_file(tmp_path / "list.yaml") == {"a.b": 1, "c": "x"}
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InputError, match="a list must hold KEY=VALUE overrides: expected KEY=VALUE, but got 'a'"):
        read_config_file(tmp_path / "list.yaml")
    (tmp_path / "scalar.yaml").write_text("42\n")
    with pytest.raises(InputError, match="mapping"):
        read_config_file(tmp_path / "scalar.yaml")
    with pytest.raises(InputError, match="cannot read"):
        read_config_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "sets, words",
    [
        (["actor_rollout_ref.actor.optim.lrr=1e-4"], "unknown key `actor_rollout_ref.actor.optim.lrr`"),
        (["data.train_batch_size=lots"], "`data.train_batch_size` must be an integer"),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=48"],
         "must be divisible by `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` (48). [rule mini_batch_divisible_by_micro]"),
        (["no_equals_sign"], "KEY=VALUE"),
    ],
)
def test_bad_input_gives_a_clear_error_and_no_trial(tmp_path, capsys, sets, words):
    out = tmp_path / "trial"
    code = run_trial("local", 3, out, sets, None, 0, {})
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and "no trial was started" in err
    assert not out.exists()


def test_unknown_backend_and_occupied_out_are_refused(tmp_path, capsys):
    assert run_trial("nope", 3, tmp_path / "t", [], None, 0, {}) == 2
    assert "unknown backend" in capsys.readouterr().err
    occupied = tmp_path / "old"
    occupied.mkdir()
    (occupied / "metrics.jsonl").write_text("")
    assert run_trial("local", 3, occupied, [], None, 0, {}) == 2
    assert "already holds a trial" in capsys.readouterr().err


def test_foreground_trial_completes(tmp_path, local_tiny_config, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in local_tiny_config.items()))
    out = tmp_path / "run"
    code = run_trial("local", 3, out, ["trainer.test_freq=2", "seed=7"], cfg, 0, {"memory_capacity_gb": 2.0})
    assert code == 0, (out / "trial.log").read_text()[-2000:]
    status = json.loads((out / "status.json").read_text())
    launch = status.pop("launch")  # who started it (the proof a resumed tuner checks): this trial's own worker
    assert status == {"status": "completed", "reason": None, "last_step": 3}
    assert launch["token"] and launch["pid"] > 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    written = json.loads((out / "config.json").read_text())
    assert written["seed"] == 7 and written["trainer.test_freq"] == 2
    assert "completed" in capsys.readouterr().err


def test_ctrl_c_stops_the_trial(tmp_path, local_tiny_config):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(local_tiny_config))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "mart.graph.cli", "trial", "--backend", "local", "--steps", "100000",
                             "--out", str(out), "--config", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            metrics = out / "metrics.jsonl"
            if metrics.exists() and metrics.read_text().count("\n") >= 2:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        # the trainer runs detached from the command (its own process group): a failing assertion above must not
        # leave it training for hours (issue 28)
        try:
            os.killpg(_worker_pid(out), signal.SIGKILL)
        except (OSError, AssertionError, IndexError, ValueError):
            pass
    assert proc.returncode == 4, err[-2000:]
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "stopped" and "Ctrl-C" in status["reason"]
    assert not _alive(_worker_pid(out))


def _worker_pid(out: Path) -> int:
    first = (out / "trial.log").read_text().splitlines()[0]
    assert first.startswith("local GRPO trial"), first
    return int(first.split("pid ")[1].split(")")[0])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
