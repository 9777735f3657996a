"""Issue 46's promises on trials, each held by a fast test that fails when the promise is broken (mutants MQ*).

- a trial started just before a kill -9 of the tuner is adopted on resume, never launched again;
- a stopped or cut trial never keeps a partial throughput as a result (the ledger, the report);
- ``--schedule-budget N`` never runs more than N segment-trials;
- ``mart export --format sh`` of the final config shell-quotes every override.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from mart.graph.services import build_services
from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.models import TrialRecord, TrialStatus
from mart.state.options import TuneOptions
from mart.state.run_store import RunStore
from mart.state.trials import RunningTrial, TrialPoll
from mart.tools.collect import collect_trial
from mart.tools.launch import launch_trial
from tests.support import toy_backend
from tests.support.toy_backend import START_LINE

TOY = "tests.support.toy_backend:make_backend"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def launches(monkeypatch) -> Counter:
    """``ToyRunner.launch`` calls per trial id (in this process): "started once" is counted, not inferred."""
    counts: Counter = Counter()
    real = toy_backend.ToyRunner.launch

    def counting(self, spec):
        counts[spec.trial_id] += 1
        return real(self, spec)

    monkeypatch.setattr(toy_backend.ToyRunner, "launch", counting)
    return counts


def _starts(trial_dir) -> int:
    log = Path(trial_dir) / "trial.log"
    return sum(line.startswith(START_LINE) for line in log.read_text().splitlines()) if log.exists() else 0


def _toy_options(tmp_path, **kw) -> TuneOptions:
    base = dict(backend=TOY, approve="auto", runs_dir=str(tmp_path), quiet=True, watch_interval_s=0.01,
                system_trials=3, learning_trials=0, system_horizon=6, backend_options={"stream": True})
    base.update(kw)
    return TuneOptions(**base)


def _state(store: RunStore, opts: TuneOptions, record: TrialRecord) -> dict:
    return {"queue": [record], "running": {}, "trial_seq": 0, "stage": record.stage, "run_id": store.run_id,
            "run_dir": str(store.run_dir), "options": opts.model_dump(mode="json")}


class _Killed(BaseException):
    """kill -9 of the tuner: nothing after it runs (not an Exception: no handler of the node catches it)."""


def test_a_trial_started_just_before_a_kill_is_adopted_on_resume_not_launched_again(tmp_path, launches,
                                                                                     monkeypatch):
    opts = _toy_options(tmp_path)
    store = RunStore.create(opts.runs_dir, None)
    record = TrialRecord(trial_id="sys-01-baseline", stage="system", kind="baseline",
                         config=toy_backend.make_backend().base_config())
    state = _state(store, opts, record)
    # the first tuner dies after the trainer started, before the trial's handle reached the ledger
    first = build_services(opts, store)
    real_set = store.ledger.set_trial_fields

    def die_at_the_handle(trial_id, **fields):
        if "handle" in fields:
            raise _Killed
        return real_set(trial_id, **fields)

    monkeypatch.setattr(store.ledger, "set_trial_fields", die_at_the_handle)
    with pytest.raises(_Killed):
        launch_trial(state, SimpleNamespace(context=first))
    monkeypatch.setattr(store.ledger, "set_trial_fields", real_set)
    row = store.ledger.trial(record.trial_id)
    assert row["status"] == "running" and row["launch_token"] and not row["handle"]  # the launch window
    assert launches[record.trial_id] == 1 and _starts(row["trial_dir"]) == 1
    # the resumed tuner (new services, a runner that never saw the launch) re-runs the node with the same input
    second = build_services(opts, store)
    out = launch_trial(state, SimpleNamespace(context=second))
    running = out.update["running"][record.trial_id]
    assert launches[record.trial_id] == 1 and _starts(row["trial_dir"]) == 1, "the trial was launched again"
    assert running.handle is not None and running.handle.extra.get("adopted")
    after = store.ledger.trial(record.trial_id)
    assert after["handle"]["extra"] == {"adopted": True}
    assert after["launch_token"] == row["launch_token"] and after["started_at"] == row["started_at"]
    for s in (first, second):
        s.close()
    store.close()


def _run_to_step(runner, handle, step: int) -> None:
    for _ in range(step):
        assert runner.poll(handle).status is TrialStatus.RUNNING


@pytest.mark.parametrize("how", ["stopped by mart", "cut at its early look", "killed from outside"])
def test_a_stopped_or_cut_trial_never_keeps_a_partial_throughput_as_a_result(tmp_path, how):
    from mart.graph.report_data import load_run, trial_rows
    from mart.nodes.stages.system import CUT_REASON

    opts = _toy_options(tmp_path)
    store = RunStore.create(opts.runs_dir, None)
    services = build_services(opts, store)
    record = TrialRecord(trial_id="sys-02-c1", stage="system", kind="candidate",
                         config=toy_backend.make_backend().base_config())
    state = _state(store, opts, record)
    out = launch_trial(state, SimpleNamespace(context=services))
    rt: RunningTrial = out.update["running"][record.trial_id]
    # past the throughput window's steps (3-5 of 6): a partial figure exists, and must not become a result
    _run_to_step(services.runner, rt.handle, 4)  # steps 0-4 of 6
    reason = {"stopped by mart": "health: entropy_collapse", "cut at its early look": f"{CUT_REASON}: slow",
              "killed from outside": None}[how]
    if reason:
        services.runner.stop(rt.handle, reason=reason)
    else:  # a signal from outside: the job ended stopped, mart asked nothing
        services.runner.stop = lambda handle, reason="", grace_s=5.0: TrialPoll(status=TrialStatus.STOPPED,
                                                                                  reason="killed by signal 9")
        services.runner.poll = lambda handle: TrialPoll(status=TrialStatus.STOPPED, reason="killed by signal 9")
    services.ledger.add_metrics(record.trial_id, services.runner.read_all_metrics(rt.handle))
    from mart.state.metrics import THROUGHPUT_KEY, mean_over_steps

    partial = mean_over_steps(services.ledger.metric_records(record.trial_id), THROUGHPUT_KEY, 3, 5)
    assert partial == partial and partial > 0, "the setup: the trial measured throughput over the window"
    finished = rt.model_copy(update={"finished": True, "stop_reason": reason})
    collect_trial({**state, "queue": [], "running": {record.trial_id: finished}, "trials_done": {}},
                  SimpleNamespace(context=services))
    row = services.ledger.trial(record.trial_id)
    assert row["status"] == "stopped" and row["throughput"] is None and row["score"] is None, row
    services.close()
    store.close()
    [reported] = [r for r in trial_rows(load_run(Path(tmp_path) / store.run_id)) if r[0] == record.trial_id]
    assert not any(c.isdigit() for c in reported[4]), f"the report shows {reported[4]} tok/s for a trial that ended early"


def _schedule_options(tmp_path, **kw) -> TuneOptions:
    base = dict(backend="sim", backend_options={"clock": "poll", "steps_per_poll": 5}, approve="auto",
                runs_dir=str(tmp_path), stages=["schedule"], learning_horizon=12, schedule_segments=3,
                schedule_branches=3, watch_interval_s=0.01, quiet=True, report=False)
    base.update(kw)
    return TuneOptions(**base)


def test_the_schedule_budget_caps_the_segment_trials_over_budgets_and_seeds(tmp_path):
    grew = set()
    # each budget on two seeds, one of them with three slots (a branch batch beside the continuation)
    for (budget, seed), parallel in zip(itertools.product((1, 2, 3, 5), (0, 1)), itertools.cycle((1, 3))):
        runs = tmp_path / f"b{budget}-s{seed}-p{parallel}"
        summary = tune(_schedule_options(runs, schedule_budget=budget, seed=seed, parallel=parallel))
        assert summary["status"] == "completed"
        rows = Ledger.open(runs / summary["run_id"]).trials("schedule")
        assert len(rows) <= budget, (budget, seed, parallel, [r["trial_id"] for r in rows])
        assert summary["schedule"]["branches_run"] == len(rows)
        grew.add((budget, len(rows)))
    assert {(1, 1), (2, 2), (3, 3), (5, 5)} <= grew, "the budget is used, not only respected"


def test_the_schedule_budget_counts_the_re_run_of_a_root_killed_from_outside(tmp_path, monkeypatch):
    # a root killed by a signal runs once more (a kill says nothing of its config): that run is a segment-trial
    real = toy_backend.ToyRunner.poll

    def killed_root(self, handle):
        if handle.trial_id == "sch-01-baseline":
            return TrialPoll(status=TrialStatus.FAILED, reason="killed by signal 9 (SIGKILL)")
        return real(self, handle)

    monkeypatch.setattr(toy_backend.ToyRunner, "poll", killed_root)
    for budget in (1, 2):
        runs = tmp_path / f"b{budget}"
        summary = tune(_toy_options(runs, stages=["schedule"], learning_horizon=6, schedule_segments=2,
                                    schedule_branches=2, schedule_budget=budget, backend_options={}))
        rows = Ledger.open(runs / summary["run_id"]).trials("schedule")
        assert rows[0]["status"] == "failed" and "killed" in rows[0]["reason"]
        assert len(rows) <= budget, (budget, [r["trial_id"] for r in rows])
        if budget == 2:
            assert rows[1]["trial_id"].endswith("baseline-retry"), "the setup: a killed root runs once more"


def test_export_sh_shell_quotes_every_override_of_the_final_config(tmp_path):
    from tests.graph.test_hardening import cli

    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); `touch {marker}` ' \" \\ \n touch {marker} *"
    store = RunStore.create(tmp_path / "runs", "r1", options={"start_overrides": {"data.note": evil, "x.y": "a b"}})
    summary = {"run_id": "r1", "status": "completed", "system": {"best_config": {"sys.k": f"it's; touch {marker}"}},
               "learning": {"best_config": {"actor.optim.lr": 1e-6}}}
    store.ledger.upsert_run("r1", status="completed", summary=summary)
    store.close()
    out = cli("export", "r1", "--runs-dir", str(tmp_path / "runs"), "--format", "sh")
    assert out.exit_code == 0, out.stderr
    script, log = tmp_path / "final.sh", tmp_path / "argv.json"
    script.write_text(out.stdout)
    rec = tmp_path / "rec.py"
    rec.write_text(f"import json, sys\nopen({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    run = subprocess.run(["bash", str(script), "data.train_files=/x y.parquet"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "VERL_CMD": f"{sys.executable} {rec}"})
    assert run.returncode == 0, run.stderr
    assert not marker.exists(), "an override ran as shell code"
    argv = json.loads(log.read_text())
    assert argv[0] == "data.train_files=/x y.parquet"  # the user's own, first and whole
    got = dict(a.lstrip("+").split("=", 1) for a in argv[1:])
    assert set(got) == {"data.note", "x.y", "sys.k", "actor.optim.lr"}  # one argument per override
    assert "touch" in got["data.note"] and "\n" in got["data.note"] and "*" in got["data.note"]
    assert got["x.y"] in ("a b", "'a b'") and "s; touch" in got["sys.k"]  # Hydra's own quoting of the value, whole
