"""Issue 26 item 1b: mart never writes through a symbolic link planted in a run folder.

``report.html.tmp``, the report's PNGs, a trial's ``trial.log``, ``status.json.tmp`` and the simulator's
``sim_plan.json.tmp`` followed a planted symlink and overwrote its target. Each case plants the link, lets
mart write, and checks the target is untouched (and the write either went to a real file or was refused).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from mart.state.files import UnsafePath, open_in, write_atomic
from mart.state.run_store import RunError, RunStore
from mart.state.trials import TrialSpec

pytestmark = pytest.mark.timeout(120)
KEEP = "precious: keep me\n"


def victim(tmp_path: Path, name: str = "precious.txt") -> Path:
    path = tmp_path / name
    path.write_text(KEEP)
    return path


def cli(*args: str):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    return CliRunner().invoke(app, list(args))


def test_the_helper_refuses_links_on_the_way_and_replaces_a_link_at_the_end(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    target = victim(tmp_path)
    (root / "log").symlink_to(target)
    with pytest.raises(UnsafePath):
        open_in(root, "log", "a")  # appending to a link: refused
    (root / "log2").symlink_to(target)
    with open_in(root, "log2", "w") as f:  # a new file anyway: the link is replaced, not followed
        f.write("new")
    assert (root / "log2").read_text() == "new" and not (root / "log2").is_symlink()
    (root / "dir").symlink_to(tmp_path)
    with pytest.raises(UnsafePath):
        open_in(root, "dir/precious.txt", "w")
    with pytest.raises(UnsafePath):
        write_atomic(root, root / "dir" / "precious.txt", "x")
    import os

    os.mkfifo(root / "fifo")
    with pytest.raises(UnsafePath):  # refused at once, not blocked waiting for a reader
        open_in(root, "fifo", "w")
    write_atomic(root, "log", "mine")  # the link is replaced by a file of mart's
    assert (root / "log").read_text() == "mine" and not (root / "log").is_symlink()
    assert target.read_text() == KEEP
    with open_in(root, "a/b/c.txt", "w") as f:
        f.write("ok")
    assert (root / "a" / "b" / "c.txt").read_text() == "ok"


def test_report_never_writes_through_planted_links(tmp_path):
    from tests.graph.test_hardening import paused_run

    run = paused_run(tmp_path)
    run_dir = tmp_path / run
    targets = [victim(tmp_path, f"v{i}.txt") for i in range(3)]
    (run_dir / "report.html.tmp").symlink_to(targets[0])
    (run_dir / "report").mkdir()
    (run_dir / "report" / "best_so_far.png").symlink_to(targets[1])
    (run_dir / "report.md").symlink_to(targets[2])
    for fmt in ("html", "md"):
        out = cli("report", run, "--runs-dir", str(tmp_path), "--format", fmt)
        assert out.exit_code == 0, out.stderr
    assert all(t.read_text() == KEEP for t in targets)
    assert (run_dir / "report.html").is_file() and not (run_dir / "report.md").is_symlink()
    # the figures folder itself a link elsewhere: refused in one line, nothing written there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    import shutil

    shutil.rmtree(run_dir / "report")
    (run_dir / "report").symlink_to(elsewhere)
    out = cli("report", run, "--runs-dir", str(tmp_path))
    assert out.exit_code != 0 and out.stderr.startswith("error:") and "Traceback" not in out.stderr
    assert "symbolic link" in out.stderr and list(elsewhere.iterdir()) == []


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path):
    import sqlite3

    folder = tmp_path / "notarun"
    folder.mkdir()
    sqlite3.connect(folder / "mart.sqlite").execute("create table x (a)").connection.close()
    before = sorted(p.name for p in folder.iterdir())
    out = cli("report", str(folder))
    assert out.exit_code == 2 and "not a mart run" in out.stderr
    assert sorted(p.name for p in folder.iterdir()) == before
    from mart.graph.report import write_report

    with pytest.raises((RunError, FileNotFoundError)):
        write_report(folder)
    assert sorted(p.name for p in folder.iterdir()) == before


def test_trial_files_never_follow_links(tmp_path, local_tiny_config):
    from mart.trial_runner.base import write_status
    from mart.trial_runner.local.runner import LocalRunner
    from mart.trial_runner.sim import SimBackend

    # the sim: trial.log and the plan's temporary file planted as links
    backend = SimBackend(scenario="qwen3-0.6b-1x8", clock="poll")
    d = tmp_path / "sim1"
    d.mkdir()
    t_log, t_plan, t_status = victim(tmp_path, "a"), victim(tmp_path, "b"), victim(tmp_path, "c")
    (d / "trial.log").symlink_to(t_log)
    (d / "sim_plan.json.tmp").symlink_to(t_plan)
    (d / "status.json.tmp").symlink_to(t_status)
    runner = backend.make_runner()
    spec = TrialSpec(trial_id="sim1", config=backend.base_config(), steps=3, trial_dir=str(d), seed=0,
                     memory_capacity_gb=backend.memory_capacity_gb())
    handle = runner.launch(spec)
    while not runner.poll(handle).status.is_finished():
        pass
    assert [t.read_text() for t in (t_log, t_plan, t_status)] == [KEEP] * 3
    assert "[sim]" in (d / "trial.log").read_text()
    write_status(d, "failed", "x", 0)  # status.json itself a link: replaced, not followed
    # the local worker's trial.log
    d = tmp_path / "loc1"
    d.mkdir()
    t_log = victim(tmp_path, "d")
    (d / "trial.log").symlink_to(t_log)
    (d / "config.json").symlink_to(t_status)
    runner = LocalRunner()
    try:
        handle = runner.launch(TrialSpec(trial_id="loc1", config=local_tiny_config, steps=1, trial_dir=str(d)))
    except UnsafePath:
        handle = None  # refusing is fine too; following is not
    if handle is not None:
        deadline = time.monotonic() + 60
        while not runner.poll(handle).status.is_finished():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert t_log.read_text() == KEEP and t_status.read_text() == KEEP


def test_verl_runner_trial_log_and_a_symlinked_trial_folder(tmp_path):
    from mart.trial_runner.verl.runner import VerlRunner
    from tests.support.paths import FAKE_VERL

    d = tmp_path / "v1"
    d.mkdir()
    t_log = victim(tmp_path, "e")
    (d / "trial.log").symlink_to(t_log)
    runner = VerlRunner(f"{sys.executable} {FAKE_VERL}", sample_gpu=False, gpu_free_threshold_gb=None)
    try:
        runner.launch(TrialSpec(trial_id="v1", config={"fake.step_s": 0.01}, steps=1, trial_dir=str(d)))
    except UnsafePath:
        pass
    assert t_log.read_text() == KEEP
    # a run's trial folder that is a link elsewhere is refused before anything is written into it
    store = RunStore.create(tmp_path / "runs", "r1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (store.run_dir / "trials" / "sys-01-baseline").symlink_to(elsewhere)
    with pytest.raises(RunError, match="symbolic link"):
        store.trial_dir("sys-01-baseline")
    store.close()


def test_status_reads_a_trial_folder_only_when_it_is_no_link(tmp_path):
    from mart.graph.run_status import trial_folder_progress

    store = RunStore.create(tmp_path / "runs", "r1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n{"step": 2, "data": {}}\n')
    (elsewhere / "status.json").write_text('{"status": "completed", "reason": null, "last_step": 2}')
    (store.run_dir / "trials" / "linked").symlink_to(elsewhere)
    assert trial_folder_progress(store, "linked") is None and trial_folder_progress(store, "absent") is None
    real = store.trial_dir("real")
    (real / "metrics.jsonl").symlink_to(elsewhere / "metrics.jsonl")
    (real / "status.json").symlink_to(elsewhere / "status.json")
    assert trial_folder_progress(store, "real") == {"steps": 0, "ended": None}  # links out of the folder
    # a link inside the folder is followed (a verl trial's metrics.jsonl names its attempt's file)
    (real / "metrics.jsonl").unlink()
    (real / "attempt-1").mkdir()
    (real / "attempt-1" / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n')
    (real / "metrics.jsonl").symlink_to(real / "attempt-1" / "metrics.jsonl")
    assert trial_folder_progress(store, "real") == {"steps": 1, "ended": None}
    for name in ("metrics.jsonl", "status.json"):
        (real / name).unlink()
        (real / name).write_text((elsewhere / name).read_text())
    assert trial_folder_progress(store, "real") == {"steps": 2, "ended": "completed"}
    for junk in ('{"status": "exploded"}', "[1, 2]", '{"no": "status"}'):  # a folder's file is foreign text
        (real / "status.json").write_text(junk)
        assert trial_folder_progress(store, "real") == {"steps": 2, "ended": None}
    store.close()
