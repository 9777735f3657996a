"""The graph's runtime context: the services the nodes use (backend, runner, ledger, agents).

They hold connections and processes, so they never enter graph state. The session driver passes them as
``context=`` and nodes read ``runtime.context``. Where no context is given (LangGraph Studio compiles the
graph without one), they are built from the state's options by the factory the graph layer registers
(``mart.graph.services``), and cached per run directory.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from langgraph.config import get_config
from langgraph.runtime import Runtime

from mart.nodes.agents.base import Critic, Proposer
from mart.nodes.progress import ProgressEvent
from mart.state.ledger import Ledger
from mart.state.objectives import memory_limit_gb
from mart.state.options import TuneOptions
from mart.state.run_store import RunStore
from mart.trial_runner.base import Backend, TrialRunner
from mart.trial_runner.watchdog import WatchdogConfig


@dataclass
class Services:
    options: TuneOptions
    store: RunStore
    backend: Backend
    runner: TrialRunner
    proposer: Proposer
    critic: Critic
    progress: Callable[[ProgressEvent], None] | None = None
    """Extra progress sink (besides LangGraph's custom stream): the CLI's console, a Slack thread."""
    _capacity: float | None = field(default=None, repr=False)

    @property
    def ledger(self) -> Ledger:
        return self.store.ledger

    @property
    def run_id(self) -> str:
        return self.store.run_id

    def memory_capacity_gb(self) -> float | None:
        if self._capacity is None:
            self._capacity = self.options.memory_capacity_gb or self.backend.memory_capacity_gb()
        return self._capacity

    def job_description(self):
        """The backend's description of the job (``None`` = unknown), with the capacity the margin uses."""
        if not hasattr(self, "_job"):
            try:
                job = self.backend.describe_job()
            except Exception:  # noqa: BLE001 - a backend that cannot describe its job leaves the model off
                job = None
            cap = self.memory_capacity_gb()
            if job is not None and cap is not None and job.hardware.memory_gb != cap:
                job = job.model_copy(update={"hardware": job.hardware.model_copy(update={"memory_gb": cap})})
            self._job = job
        return self._job

    def memory_limit_gb(self) -> float | None:
        return memory_limit_gb(self.memory_capacity_gb(), self.options.memory_margin)

    def watchdog(self):
        """The progress watchdog's limits for this session's trials (``mart.trial_runner.watchdog``)."""

        return WatchdogConfig(enabled=not getattr(self.runner, "watches_progress", False),
                              stall_timeout_s=self.options.stall_timeout_s,
                              first_step_timeout_s=self.options.first_step_timeout_s)

    def trial_slots(self) -> int:
        """How many trials run at once: ``--parallel``, at most what the backend holds (``Backend.max_parallel_trials``)."""
        if not hasattr(self, "_slots"):
            try:
                cap = self.backend.max_parallel_trials()
            except Exception:  # noqa: BLE001 - a backend that cannot tell holds what the user asked for
                cap = None
            self._slots = max(1, min(self.options.parallel, cap) if cap else self.options.parallel)
        return self._slots

    def trial_devices(self, slot: int) -> str | None:
        """The GPUs a trial in ``slot`` may use when several trials share this machine's GPUs (None: all)."""
        if self.trial_slots() <= 1:
            return None
        try:
            return self.backend.trial_devices(slot)
        except Exception:  # noqa: BLE001 - a backend that cannot tell leaves its trials the whole machine
            return None

    def slots_note(self) -> str | None:
        """Why the session runs fewer trials at once than ``--parallel`` asked for (None: it runs as many)."""
        slots = self.trial_slots()
        if slots >= self.options.parallel:
            return None
        try:
            why = self.backend.parallel_limit_reason()
        except Exception:  # noqa: BLE001
            why = "the backend's limit"
        return (f"--parallel {self.options.parallel}: the {self.backend.name} backend runs {slots} trial(s) at once "
                f"({why}); the other trials wait for a free slot")

    def close(self) -> None:
        self.runner.close()


ServicesFactory = Callable[[TuneOptions, RunStore, "str | None"], Services]
_FACTORY: ServicesFactory | None = None
_CACHE: dict[str, Services] = {}
_CACHE_LOCK = threading.Lock()


def register_services_factory(factory: ServicesFactory) -> None:
    """Set how services are built for a run without a runtime context (the graph layer does this)."""
    global _FACTORY
    _FACTORY = factory


def _thread_id() -> str | None:
    try:
        return (get_config().get("configurable") or {}).get("thread_id")
    except RuntimeError:  # called outside a graph run
        return None


def ensure_run(state: Mapping[str, Any]) -> dict[str, str]:
    """``run_id``/``run_dir`` of the session, creating the run directory when the input has none.

    The session driver always passes both. A LangGraph Studio run starts from ``{"options": {...}}``
    only: its run is ``studio-<thread id>`` under ``options.runs_dir`` (created once; the start node may
    re-run after a crash and then finds it).
    """
    if state.get("run_dir"):
        return {"run_id": state.get("run_id") or Path(state["run_dir"]).name, "run_dir": state["run_dir"]}
    options = TuneOptions(**(state.get("options") or {}))
    run_id = state.get("run_id")
    if not run_id:
        thread = "".join(c for c in str(_thread_id() or "") if c.isalnum() or c in "-_")[:40]
        if not thread:
            raise ValueError("state has no run_dir and the call has no thread_id: give one of them")
        run_id = f"studio-{thread}"
    run_dir = Path(options.runs_dir).resolve() / run_id
    if not (run_dir / "trials").is_dir():
        # the driver is recorded: `mart status/resume/review` must not treat a Studio thread's run as their own
        RunStore.create(options.runs_dir, run_id, driver="studio", thread_id=run_id.removeprefix("studio-")).close()
    return {"run_id": run_id, "run_dir": str(run_dir)}


def services_for(state: Mapping[str, Any], runtime: Runtime[Services] | None) -> Services:
    """The services of this invocation: ``runtime.context``, else (a run without a context, as in LangGraph
    Studio) cached ones built from the state's options."""
    ctx = getattr(runtime, "context", None)
    if isinstance(ctx, Services):
        return ctx
    run_dir = state.get("run_dir")
    if not run_dir:
        raise ValueError("state has no run_dir: start sessions through mart.graph.session or the start node")
    if _FACTORY is None:
        raise RuntimeError("no runtime context and no services factory: import mart.graph.services first")
    with _CACHE_LOCK:
        if run_dir not in _CACHE:
            store = RunStore(Path(run_dir), state.get("run_id") or Path(run_dir).name)
            options = TuneOptions(**(state.get("options") or {}))
            _CACHE[run_dir] = _FACTORY(options, store, os.environ.get("OPENAI_API_KEY"))
        return _CACHE[run_dir]
