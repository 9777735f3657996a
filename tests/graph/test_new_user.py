"""What a new user trips on, through the command line: a bad --set is refused before a run exists, a session whose
trials all crashed is "failed" and exits non-zero, `mart resume` after a rejection shows the next candidate (which
follows the feedback), `mart export --format sh` launches the final config, `mart trial --backend verl` without verl
says how to install it, and small memory is printed with its digits."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from mart.graph.progress_console import format_event
from mart.nodes.progress import TrialDone
from mart.state.ledger import Ledger
from mart.state.units import fmt_gb
from tests.support.cli import TOY, cli, paused_toy_run
from tests.support.toy_backend import LR, MB, SEQS, ToyBackend, ToyRunner, simulate

SMALL = ["--system-trials", "2", "--learning-trials", "0", "--system-horizon", "3", "--watch-interval-s", "0.01",
         "--no-report"]


def test_a_bad_set_is_refused_against_the_catalogue_before_the_run_exists(tmp_path):
    runs = tmp_path / "runs"
    bad = cli("tune", "--backend", "local", "--set", "lr=abc", "--runs-dir", str(runs), "--approve", "none", *SMALL)
    assert bad.exit_code == 2
    assert "actor_rollout_ref.actor.optim.lr" in bad.stderr and "must be a number" in bad.stderr
    unknown = cli("tune", "--backend", "local", "--set", "learning_rat=1e-6", "--runs-dir", str(runs), *SMALL)
    assert unknown.exit_code == 2 and "`learning_rat` is not a tunable knob" in unknown.stderr
    assert not runs.exists() or not any(runs.iterdir())  # nothing was created
    # a good value by its short name is kept under the knob's key, so every stage and the export see it
    ok = cli("tune", "--backend", TOY, "--set", "lr=0.002", "--runs-dir", str(runs), "--approve", "auto", "--json",
             "-q", *SMALL)
    assert ok.exit_code == 0, ok.output
    run = json.loads(ok.stdout)["run_id"]
    trials = Ledger.open(runs / run).trials()
    assert trials and all(t["config"][LR] == 0.002 for t in trials) and all("lr" not in t["config"] for t in trials)


class CrashRunner(ToyRunner):
    @staticmethod
    def simulate(config, steps, **kw):
        rows, _ = simulate(config, steps, **kw)
        return rows[:2], "failed"


class CrashBackend(ToyBackend):
    def make_runner(self):
        return CrashRunner()


def make_crash(**options):
    return CrashBackend(**options)


def test_a_session_whose_trials_all_crash_is_failed_and_exits_non_zero(tmp_path):
    out = cli("tune", "--backend", "tests.graph.test_new_user:make_crash", "--runs-dir", str(tmp_path),
              "--approve", "auto", "--json", "-q", *SMALL)
    assert out.exit_code == 1, out.output
    summary = json.loads(out.stdout)
    assert summary["status"] == "failed" and "no trial completed" in summary["error"]
    info = json.loads(cli("status", summary["run_id"], "--runs-dir", str(tmp_path), "--json").stdout)
    assert info["status"] == "failed" and "no trial completed" in info["error"]
    listing = cli("status", "--runs-dir", str(tmp_path))
    assert "failed" in listing.stdout and "completed" not in listing.stdout
    again = cli("resume", summary["run_id"], "--runs-dir", str(tmp_path), "--trust-run")
    assert again.exit_code == 1 and "the session failed" in again.stderr


def test_resume_after_a_reject_shows_the_next_candidate_and_it_follows_the_feedback(tmp_path):
    runs = str(tmp_path)
    first = paused_toy_run(runs)
    run = first["run_id"]
    assert [d["key"] for d in first["pending_review"]["candidates"][0]["diff"]] == [SEQS], "precondition"
    out = cli("review", run, "--runs-dir", runs, "--reject", "don't touch max_num_seqs; raise the micro batch", "-q")
    assert out.exit_code == 0, out.output
    resumed = cli("resume", run, "--runs-dir", runs, "-q")
    assert resumed.exit_code == 0, resumed.output
    text = resumed.stdout
    # the pending review is shown: a candidate that raises the micro batch and leaves max_num_seqs alone
    assert "Review #2" in text and f"{MB}: 2 -> 4" in text and SEQS not in text.split("Rationale")[0]
    assert "Read your feedback as: raise micro_batch, leave max_num_seqs alone" in text
    assert f"mart review {run}" in text
    # and the run goes on from there
    done = json.loads(cli("review", run, "--runs-dir", runs, "--approve", "--json", "-q").stdout)
    assert done["status"] in ("paused", "completed")
    trials = Ledger.open(Path(runs) / run).trials()
    assert trials[-1]["config"][MB] == 4 and trials[-1]["config"][SEQS] == 8


def test_export_sh_launches_the_final_config_with_the_users_overrides_first(tmp_path):
    out = cli("tune", "--backend", TOY, "--runs-dir", str(tmp_path), "--approve", "auto", "--json", "-q",
              "--set", "lr=0.002", *SMALL)
    summary = json.loads(out.stdout)
    script = tmp_path / "final.sh"
    text = cli("export", summary["run_id"], "--runs-dir", str(tmp_path), "--format", "sh").stdout
    script.write_text(text)
    env = {**os.environ, "VERL_CMD": "printf %s\\n"}
    args = subprocess.run(["bash", str(script), "data.train_files=/x.parquet"], env=env, capture_output=True,
                          text=True, check=True).stdout.splitlines()
    expected = {LR: 0.002, **summary["system"]["best_config"], **summary["learning"]["best_config"]}
    assert args[0] == "data.train_files=/x.parquet"  # the user's own first; mart's values follow
    got = dict(a.lstrip("+").split("=", 1) for a in args[1:])
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == (str(value).lower() if isinstance(value, bool) else str(value)), key
    assert shlex.split(text.splitlines()[-1])[-1] in args[-1]


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
def test_mart_trial_on_verl_without_verl_says_how_to_install_it(tmp_path):
    out = cli("trial", "--backend", "verl", "--out", str(tmp_path / "t"), "--steps", "2")
    assert out.exit_code == 2
    assert "verl is not installed: pip install -e '.[verl]'" in out.output
    assert not (tmp_path / "t").exists()
    tune = cli("tune", "--backend", "verl", "--runs-dir", str(tmp_path / "runs"), "--approve", "none")
    assert tune.exit_code == 2 and "verl is not installed" in tune.stderr and not (tmp_path / "runs").exists()


def test_small_memory_keeps_its_digits():
    assert fmt_gb(0.0751) == "0.0751 GB" and fmt_gb(0.018102) == "0.0181 GB" and fmt_gb(70.123) == "70.12 GB"
    line, _ = format_event(TrialDone(trial_id="t", status="completed", eligible=True, peak_memory_gb=0.018102))
    assert "peak 0.0181 GB" in line and "0.0 GB" not in line and "0.02 GB" not in line


def test_the_job_models_next_candidate_follows_a_rejections_request(tmp_path, local_tiny_config):
    """On the local workload the job model proposes; a rejection asking to raise one knob and leave another alone
    brings a candidate that raises it (the model's picks that ignore the request give way)."""
    runs = str(tmp_path)
    sets = [a for k, v in local_tiny_config.items() for a in ("--set", f"{k}={v}")]
    out = cli("tune", "--backend", "local", *sets, "--approve", "none", "--runs-dir", runs, "--json", "-q",
              "--system-trials", "3", "--learning-trials", "0", "--system-horizon", "3", "--no-report")
    assert out.exit_code == 0, out.output
    first = json.loads(out.stdout)
    assert "job model" in first["pending_review"]["candidates"][0]["rationale"], "precondition: the model proposes"
    seqs = "actor_rollout_ref.rollout.max_num_seqs"
    dyn = "actor_rollout_ref.actor.use_dynamic_bsz"
    rejected = cli("review", first["run_id"], "--runs-dir", runs, "--reject",
                   "don't use dynamic batch size; raise the rollout concurrency instead", "-q")
    assert rejected.exit_code == 0, rejected.output
    info = json.loads(cli("status", first["run_id"], "--runs-dir", runs, "--json").stdout)
    [cand] = info["pending_review"]["candidates"]
    moved = {d["key"]: d for d in cand["diff"]}
    assert seqs in moved and moved[seqs]["proposed"] > moved[seqs]["current"], (cand["diff"], cand["rationale"])
    assert dyn not in moved
    assert info["pending_review"]["feedback_read"] == ["raise max_num_seqs", "leave dynamic_bsz alone"]
