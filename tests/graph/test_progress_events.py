"""Typed progress events: one model per kind, JSON on LangGraph's custom stream, one console formatter per kind."""

from __future__ import annotations

import io

import pytest
from pydantic import ValidationError

from mart.graph.progress_console import FORMATTERS, ConsoleProgress, format_event
from mart.nodes import progress
from mart.nodes.progress import (
    EVENT_TYPES,
    CritiqueDone,
    HealthNotice,
    Proposed,
    ProposedCandidate,
    SessionNote,
    TrialDone,
    TrialFailed,
    TrialLaunched,
    TrialQueued,
    TrialReattached,
    TrialStarted,
    TrialStep,
    TrialStopped,
    emit,
    parse_event,
)

SAMPLES = [
    TrialLaunched(trial_id="sys-01-baseline", stage="system", kind="baseline", horizon=6),
    TrialReattached(trial_id="sys-02-abc"),
    TrialQueued(trial_id="sys-02-abc", reason="waiting for cluster resources"),
    TrialStarted(trial_id="sys-02-abc", waited_s=42.4),
    TrialFailed(trial_id="sys-03-abc", reason="launch failed: no GPU"),
    TrialStep(trial_id="sys-01-baseline", stage="system", step=3, throughput=1234.4, memory_gb=1.5, reward=0.25),
    HealthNotice(trial_id="lea-04-x", rule="entropy_collapse", severity="stop", message="entropy 0.01 < 0.05"),
    TrialStopped(trial_id="lea-04-x", reason="health: entropy_collapse", status="stopped"),
    TrialDone(trial_id="sys-01-baseline", status="completed", throughput=1234.44, peak_memory_gb=1.5, eligible=True),
    Proposed(stage="system", round=0, candidates=[ProposedCandidate(id="sys-01-r0-c0", overrides={"a.b": 2})]),
    CritiqueDone(pick=None, feedback="all over the memory margin", accepted=[]),
    SessionNote(message="--parallel 4: the local backend runs 2 trial(s) at once"),
]


def test_every_kind_has_a_sample_and_a_formatter() -> None:
    assert {type(e) for e in SAMPLES} == set(EVENT_TYPES) == set(FORMATTERS)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.event)
def test_json_form_round_trips(event) -> None:
    data = event.model_dump(mode="json")
    assert data["event"] == event.event
    assert parse_event(data) == event
    assert format_event(data) == format_event(event)  # a consumer of the custom stream formats the same


def test_lines_say_what_happened() -> None:
    lines = {type(e): format_event(e) for e in SAMPLES}
    assert lines[TrialLaunched] == ("[bold]▶ sys-01-baseline[/]: baseline (system stage, 6 steps)", None)
    assert lines[TrialStep] == ("  sys-01-baseline step   3  1234 tok/s  1.50 GB  reward 0.250", "dim")  # absent metrics left out
    assert lines[SessionNote] == ("[yellow]note[/]: --parallel 4: the local backend runs 2 trial(s) at once", None)
    parallel = TrialLaunched(trial_id="sys-05-x", stage="system", kind="candidate", horizon=6, slot=2, slots=4)
    assert format_event(parallel)[0].endswith("(system stage, 6 steps, slot 3/4)")
    assert lines[TrialQueued] == ("  ⏸ sys-02-abc: queued (waiting for cluster resources)", "yellow")
    assert lines[TrialStarted] == ("  ▶ sys-02-abc: started after 42 s in the queue", None)
    assert lines[HealthNotice] == ("  health stop: entropy_collapse: entropy 0.01 < 0.05", "red")
    assert lines[TrialDone] == ("  ✓ sys-01-baseline: completed, 1,234 tok/s, peak 1.50 GB", None)
    assert lines[CritiqueDone] == ("[cyan]critic[/] all over the memory margin", None)
    not_eligible = TrialDone(trial_id="t", status="oom", reason="out of memory", eligible=False)
    assert format_event(not_eligible)[0] == "  ✓ t: oom (not eligible: out of memory)"
    # a candidate says what it changes, and its result how it compares with the stage's best, with units
    change = TrialLaunched(trial_id="sys-03", stage="system", kind="candidate", horizon=6,
                           changes=["dynamic_bsz False→True", "micro_batch 16→32"])
    assert format_event(change)[0] == "[bold]▶ sys-03[/]: dynamic_bsz False→True, micro_batch 16→32 (system stage, 6 steps)"
    faster = TrialDone(trial_id="sys-03", status="completed", throughput=3134.0, best_before=2912.0, eligible=True)
    assert format_event(faster)[0] == "  ✓ sys-03: completed, 3,134 tok/s (+7.6% vs best 2,912)"
    scored = TrialDone(trial_id="lea-02", status="completed", score=0.4466, best_before=0.4361, eligible=True)
    assert format_event(scored)[0] == "  ✓ lea-02: completed, val score 0.4466 (+0.0105 vs best 0.4361)"


def test_bad_events_are_refused() -> None:
    with pytest.raises(ValidationError):
        parse_event({"event": "no_such_kind", "trial_id": "t"})
    with pytest.raises(ValidationError):
        parse_event({"event": "health", "trial_id": "t", "rule": "r", "severity": "panic", "message": "m"})
    with pytest.raises(ValidationError):
        TrialReattached(trial_id="t", unexpected=1)


def test_emit_writes_json_to_the_stream_and_the_typed_event_to_the_sink(monkeypatch) -> None:
    streamed, sunk = [], []
    monkeypatch.setattr("langgraph.config.get_stream_writer", lambda: streamed.append)

    class Services:
        progress = staticmethod(sunk.append)

    event = SAMPLES[3]
    emit(Services, event)
    assert streamed == [event.model_dump(mode="json")] and isinstance(streamed[0], dict)
    assert sunk == [event]


def test_emit_outside_a_run_still_reaches_the_sink() -> None:
    sunk = []

    class Services:
        progress = staticmethod(sunk.append)

    progress.emit(Services, SAMPLES[0])  # no graph run: no stream writer, no error
    assert sunk == [SAMPLES[0]]


def test_console_prints_each_kind_and_is_silent_when_quiet() -> None:
    from rich.console import Console

    console = ConsoleProgress(quiet=False)
    console.console = Console(file=io.StringIO(), width=200, highlight=False, color_system=None)
    for event in SAMPLES:
        console(event)
    text = console.console.file.getvalue()
    assert text.count("\n") == len(SAMPLES)
    assert "▶ sys-01-baseline: baseline (system stage, 6 steps)" in text and "■ stopped" in text
    quiet = ConsoleProgress(quiet=True)
    quiet(SAMPLES[0])  # prints nothing and needs no console
    assert not hasattr(quiet, "console")


def test_a_launch_line_names_its_candidate_and_a_re_run_says_what_it_runs_again() -> None:
    picked = TrialLaunched(trial_id="lea-10-8976d0", stage="learning", kind="candidate", horizon=30,
                           candidate_id="lea-03-r0-c0", changes=["lr 1e-06→2e-06"])
    assert format_event(picked)[0] == ("[bold]▶ lea-10-8976d0[/]: candidate lea-03-r0-c0: lr 1e-06→2e-06 "
                                       "(learning stage, 30 steps)")
    confirm = TrialLaunched(trial_id="lea-07-baseline-s2", stage="learning", kind="confirm", horizon=30,
                            rerun_of="lea-07-baseline", seed=1)
    assert format_event(confirm)[0] == ("[bold]▶ lea-07-baseline-s2[/]: re-run of lea-07-baseline on another seed (1), "
                                        "to confirm it (learning stage, 30 steps)")
    again = TrialLaunched(trial_id="sys-03-baseline-retry", stage="system", kind="baseline", horizon=6,
                          rerun_of="sys-01-baseline")
    assert format_event(again)[0] == "[bold]▶ sys-03-baseline-retry[/]: re-run of sys-01-baseline (system stage, 6 steps)"


def test_a_session_announces_each_pick_at_its_launch_and_each_re_run_as_one(tmp_path) -> None:
    import re

    from mart.graph.session import tune
    from tests.support.cli import sim_stage2_options

    events: list = []
    original = ConsoleProgress.__call__

    def record(self, event):  # what the console prints, as the session emits it
        events.append(event)
        return original(self, event)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ConsoleProgress, "__call__", record)
        summary = tune(sim_stage2_options(tmp_path, seed=0))
    lines = [format_event(e)[0] for e in events]
    picks = [p for e in events if isinstance(e, CritiqueDone) for p in (e.picks or [e.pick]) if p]
    launched = [e for e in events if isinstance(e, TrialLaunched)]
    assert picks and summary["learning"]["reevaluated"], "precondition: picks and re-runs on a second seed"
    for pick in picks:  # the id the critic picked meets the trial that runs it
        assert any(f"candidate {pick}:" in line for line in lines if line.startswith("[bold]▶")), pick
    reruns = [e for e in launched if e.kind == "confirm"]
    assert {e.rerun_of for e in reruns} == set(summary["learning"]["reevaluated"])
    for e in reruns:
        line = format_event(e)[0]
        assert f"re-run of {e.rerun_of} on another seed" in line and "→" not in line, line
        assert not re.search(r"\w \S+→\S+", line)
    # the report's trial table names the same origins
    from mart.graph.report import write_report

    page = write_report(tmp_path / summary["run_id"], "md").read_text().replace("\\", "")
    for e in launched:
        row = next(x for x in page.splitlines() if x.startswith(f"| {e.trial_id} |"))
        origin = row.split("|")[2].strip()
        if e.rerun_of:
            assert origin.startswith(f"re-run of {e.rerun_of}"), row
        elif e.candidate_id:
            assert origin == f"candidate {e.candidate_id}", row
