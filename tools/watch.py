"""Watch tool node: follows the active trial, copies its new metric lines into the ledger, reports progress.

It returns after new steps arrived (so the health monitor sees them) or when the trial ended; the state
it keeps is only the handle, so a resumed graph simply watches again.
"""

from __future__ import annotations

import math
import time
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.progress import TrialStep, emit
from mart.nodes.runtime import Services, services_for
from mart.state.graph_state import TuningState, active_handle
from mart.state.metrics import StepRecord
from mart.state.models import TrialRecord

#: Upper bound of one watch pass without new steps, so a hung trial still reaches the health monitor.
MAX_PASS_S = 30.0


def watch_trial(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["health_monitor"]]:
    services = services_for(state, runtime)
    handle = active_handle(state)
    assert handle is not None, "watch_trial runs only while a trial is active"
    record = state["pending_trial"]
    ledger = services.ledger
    tail = services.runner.metrics(handle)
    known = {r.step for r in ledger.metric_records(handle.trial_id)}
    started = time.monotonic()
    interval = services.options.watch_interval_s
    new_steps = 0
    finished = False
    while True:
        records = tail.read_new()
        fresh = [r for r in records if r.step not in known]
        if records:
            ledger.add_metrics(handle.trial_id, records)
        for rec in fresh:
            known.add(rec.step)
            new_steps += 1
            emit(services, _progress_event(record, rec))
        poll = services.runner.poll(handle)
        if poll.status.is_finished():
            ledger.add_metrics(handle.trial_id, tail.read_new())  # lines written just before the end
            finished = True
            break
        elapsed = time.monotonic() - started
        if (new_steps and elapsed >= interval) or elapsed >= MAX_PASS_S:
            break
        time.sleep(min(0.25, interval))
    return Command(goto="health_monitor", update={"trial_finished": finished})


def _progress_event(record: TrialRecord, rec: StepRecord) -> TrialStep:
    def val(key: str) -> float | None:
        v = rec.get(key)
        return None if math.isnan(v) else v

    score = next((v for k, v in rec.data.items() if k.startswith("val-core/") and not math.isnan(v)), None)
    return TrialStep(
        trial_id=record.trial_id, stage=record.stage, step=rec.step, throughput=val("perf/throughput"),
        memory_gb=val("perf/max_memory_allocated_gb") or val("actor/perf/max_memory_allocated_gb"),
        reward=val("critic/score/mean"), entropy=val("actor/entropy"), val_score=score,
    )
