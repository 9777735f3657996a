"""`launch_trial` is idempotent: re-running it for the same pending trial never starts a second process.

A graph resumed after a crash re-runs the node whose output was not checkpointed. The dangerous window is
between the ledger write of the handle and the checkpoint: the trial is running, the graph does not know.
The toy backend appends one ``toy: start`` line to ``trial.log`` per launch, and the runner's ``launch`` is
counted, so "started once" is observed, not inferred from the ledger.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from mart.graph.progress_console import ConsoleProgress
from mart.graph.services import build_services
from mart.graph.session import resume, tune
from mart.state.ledger import Ledger
from mart.state.models import TrialRecord
from mart.state.options import TuneOptions
from mart.state.run_store import RunStore
from mart.tools.launch import launch_trial
from tests.support import toy_backend
from tests.support.toy_backend import START_LINE

TOY = "tests.support.toy_backend:make_backend"


@pytest.fixture
def launches(monkeypatch) -> Counter:
    """Counts ``ToyRunner.launch`` calls per trial id (in this process)."""
    counts: Counter = Counter()
    real = toy_backend.ToyRunner.launch

    def counting(self, spec):
        counts[spec.trial_id] += 1
        return real(self, spec)

    monkeypatch.setattr(toy_backend.ToyRunner, "launch", counting)
    return counts


def _field(event, name):
    """A progress event's field, whether the event is a typed model or a plain dict."""
    return event.get(name) if isinstance(event, dict) else getattr(event, name, None)


def _starts(trial_dir) -> int:
    log = Path(trial_dir) / "trial.log"
    return sum(line.startswith(START_LINE) for line in log.read_text().splitlines()) if log.exists() else 0


def _options(tmp_path, **kw) -> TuneOptions:
    base = dict(backend=TOY, approve="auto", runs_dir=str(tmp_path), quiet=True, watch_interval_s=0.01,
                system_trials=3, learning_trials=0, system_horizon=5, backend_options={"stream": True},
                system_remeasure_share=0.25)
    base.update(kw)
    return TuneOptions(**base)


def test_launch_node_run_twice_starts_one_process(tmp_path, launches):
    opts = _options(tmp_path)
    store = RunStore.create(opts.runs_dir, None)
    services = build_services(opts, store)
    runtime = SimpleNamespace(context=services)
    backend = toy_backend.make_backend(stream=True)
    record = TrialRecord(trial_id="sys-00-baseline", stage="system", kind="baseline", config=backend.base_config())
    state = {"queue": [record], "running": {}, "trial_seq": 0, "stage": "system", "run_id": store.run_id,
             "run_dir": str(store.run_dir), "options": opts.model_dump(mode="json")}
    first = launch_trial(state, runtime)
    row = store.ledger.trial(record.trial_id)
    second = launch_trial(state, runtime)  # same input: the checkpoint never saw the first run's output
    assert first.goto == second.goto == "stage_control"
    assert first.update["queue"] == second.update["queue"] == []
    assert first.update["running"][record.trial_id].handle == second.update["running"][record.trial_id].handle
    assert launches[record.trial_id] == 1
    assert _starts(row["trial_dir"]) == 1
    again = store.ledger.trial(record.trial_id)
    assert again["handle"] == row["handle"] and again["started_at"] == row["started_at"]
    assert again["status"] == "running"
    services.close()
    store.close()


def test_interrupt_between_handle_and_checkpoint_then_resume_starts_each_trial_once(tmp_path, launches,
                                                                                    monkeypatch):
    # Ctrl-C right after the first candidate's handle reached the ledger, before the node's output is saved
    real = ConsoleProgress.__call__
    fired = []

    def interrupt_at_launch(self, event):
        if _field(event, "event") == "trial_launched" and _field(event, "kind") == "candidate" and not fired:
            fired.append(_field(event, "trial_id"))
            raise KeyboardInterrupt
        return real(self, event)

    monkeypatch.setattr(ConsoleProgress, "__call__", interrupt_at_launch)
    opts = _options(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        tune(opts)
    [run_dir] = [p for p in Path(tmp_path).iterdir() if (p / "mart.sqlite").exists()]
    ledger = Ledger.open(run_dir)
    interrupted = ledger.trial(fired[0])
    assert interrupted["handle"] and interrupted["status"] == "running"
    ledger.close()

    summary = resume(run_dir.name, tmp_path, quiet=True)
    assert summary["status"] == "completed"
    ledger = Ledger.open(run_dir)
    trials = ledger.trials("system")
    assert len(trials) == 3
    for t in trials:
        assert launches[t["trial_id"]] == 1, t["trial_id"]
        assert _starts(t["trial_dir"]) == 1, t["trial_id"]
        assert t["status"] == "completed"
    after = ledger.trial(fired[0])
    assert after["handle"] == interrupted["handle"] and after["started_at"] == interrupted["started_at"]
    assert after["steps_done"] == 5


def test_a_launch_that_raises_is_a_failed_trial_not_a_failed_session(tmp_path, monkeypatch):
    real = toy_backend.ToyRunner.launch

    def refuse_candidates(self, spec):
        if "baseline" not in spec.trial_id:
            raise RuntimeError("no GPU left")
        return real(self, spec)

    monkeypatch.setattr(toy_backend.ToyRunner, "launch", refuse_candidates)
    summary = tune(_options(tmp_path, system_trials=2))
    assert summary["status"] == "completed"
    assert summary["trials"]["failed"] == 1
    base, cand = Ledger.open(Path(tmp_path) / summary["run_id"]).trials("system")
    assert base["status"] == "completed"
    assert cand["status"] == "failed" and cand["reason"] == "launch failed: no GPU left"
    assert summary["system"]["best_config"] == {}
