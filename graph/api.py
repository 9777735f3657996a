"""Python API for notebooks: open a run, get its compiled graph and config, and drive it yourself.

Example::

    from langgraph.types import Command
    from mart.graph.api import open_run

    with open_run("20261130-154001-26f0", runs_dir="runs") as run:
        print(run.pending_review())                     # the review request (diff, rationale, critique)
        run.decide({"decisions": [{"type": "approve"}]})   # continues until the next review
        for snap in run.graph.get_state_history(run.config):   # newest first
            print(snap.metadata["step"], snap.next)

``context=`` may be left out: the nodes then build their services from the state's options (as in
LangGraph Studio). The handle holds the run's writer lock until ``close()``, so no other driver (a
``mart review``, the Slack server) moves the run under you. See ``docs/reviewers.md`` for time travel.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Collection, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from langgraph.types import Command
from pydantic import ValidationError

from mart.graph.builder import compile_graph
from mart.graph.services import build_services
from mart.graph.session import graph_config, load_options, resume_command, review_request
from mart.nodes.runtime import Services
from mart.state.models import ReviewDecision
from mart.state.run_store import RunError, RunStore


class RunHandle:
    """One open run: ``graph`` (compiled with the run's SqliteSaver), ``config``, ``context``.

    Args:
        store: the opened run.
        api_key: for LLM agents (kept in memory only; default ``$OPENAI_API_KEY``).
        lock: hold the run's writer lock while open (default). Without it, only read.
        allowed, trust: plugin backends / launch commands the run may name (see ``session.load_options``).
    """

    def __init__(self, store: RunStore, *, api_key: str | None = None, lock: bool = True,
                 allowed: Collection[str] = (), trust: bool = False) -> None:
        self.store = store
        self._api_key = api_key
        self._allowed, self._trust = tuple(allowed), trust
        self._stack = ExitStack()
        if lock:
            self._stack.enter_context(store.lock())
        self._saver = store.checkpointer()
        self.graph = _ReplayGuard(compile_graph(self._saver), self._saver)
        self.config: dict[str, Any] = graph_config(store.run_id)
        self._context: Services | None = None

    @property
    def run_id(self) -> str:
        return self.store.run_id

    @property
    def context(self) -> Services:
        """The run's services (backend, runner, ledger, agents), built on first use; pass as ``context=``."""
        if self._context is None:
            self._context = build_services(load_options(self.store, allowed=self._allowed, trust=self._trust), self.store, api_key=self._api_key)
        return self._context

    def state(self):
        """The current ``StateSnapshot`` (``.values``, ``.next``, ``.interrupts``)."""
        return self.graph.get_state(self.config)

    def pending_review(self) -> dict[str, Any] | None:
        """The pending review request (with its ``interrupt_id``), or None."""
        return review_request(self.state())

    def decide(self, decision: ReviewDecision | dict[str, Any]) -> dict[str, Any] | None:
        """Answer the pending review and run to the next one; returns it, or None when the run ended."""
        pending = self.pending_review()
        if pending is None:
            raise RunError(f"run {self.run_id} has no pending review to answer")
        if isinstance(decision, dict):
            decision = ReviewDecision.model_validate(decision)
        self.graph.invoke(resume_command(pending["interrupt_id"], decision), self.config, context=self.context,
                          durability="sync")
        return self.pending_review()

    def past_reviews(self) -> Iterator[Any]:
        """Snapshots of the checkpoints where the run stopped at a review, newest first (time travel)."""
        for snap in self.graph.get_state_history(self.config):
            if snap.next == ("human_review",) and snap.interrupts:
                yield snap

    def fork(self, snapshot_or_config: Any) -> dict[str, Any] | None:
        """Re-open a past review on a new branch: copy that checkpoint as the thread's head, run to its
        interrupt again, and return the (re-asked) review request. Answer it with ``decide``.

        Resuming the old checkpoint itself would replay the stored answer; the copy has none.
        """
        config = getattr(snapshot_or_config, "config", snapshot_or_config)
        self.graph.update_state(config, None, as_node="__copy__")
        self.graph.invoke(None, self.config, context=self.context, durability="sync")
        return self.pending_review()

    def close(self) -> None:
        if self._context is not None:
            self._context.close()
            self._context = None
        self._saver.conn.close()
        self._stack.close()
        self.store.close()

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: the channel LangGraph stores a resume value under (private in langgraph>=1.0, hence spelled out here;
#: tests/graph/test_reviewers_api.py proves it against the installed langgraph)
RESUME_CHANNEL = "__resume__"


class StaleResume(RunError):
    """A resume aimed at a review that was already answered: LangGraph would replay the stored answer."""


class BareResume(RunError):
    """A ``Command(resume=...)`` without the interrupt id of the review it answers."""


#: an interrupt id as LangGraph makes it (an xxh3-128 hex digest)
_INTERRUPT_ID = re.compile(r"[0-9a-f]{32}")


def _as_delivered(value: Any) -> Any:
    """An answer as this API records it. The channel is the one that delivered it (``api``), whatever the caller
    wrote; the reviewer is the user this process runs as, and a different name the caller gives is kept as what
    it is, a claim (``"U0BOSS (claimed; api user ann)"``): nothing here proves who the caller is. A malformed
    answer passes as it is, to be asked again in band."""
    try:
        decision = value if isinstance(value, ReviewDecision) else ReviewDecision.model_validate(value)
    except ValidationError:
        return value
    user = getpass.getuser()
    claimed = decision.reviewer.strip()
    who = user if claimed in ("", "unknown", user) else f"{claimed} (claimed; api user {user})"
    return decision.model_copy(update={"reviewer": who, "channel": "api"}).model_dump(mode="json")


class _ReplayGuard:
    """The compiled graph, except that ``invoke``/``stream`` take a ``Command(resume=...)`` only addressed to an
    interrupt id (strict resume, as the CLI and Slack answer), record each answer as the API delivered it
    (``_as_delivered``), and refuse one at a past checkpoint whose review was already answered: LangGraph replays
    the stored answer there and silently ignores the new one; ``RunHandle.fork`` re-opens such a review instead."""

    def __init__(self, graph: Any, saver: Any) -> None:
        self._graph, self._saver = graph, saver

    def __getattr__(self, name: str) -> Any:
        return getattr(self._graph, name)

    def _prepare(self, inp: Any, config: Any) -> Any:
        """``inp`` as it may reach the graph: a resume only by interrupt id, each answer as the API delivered it."""
        if not isinstance(inp, Command) or inp.resume is None:
            return inp
        self._check_stale(inp, config)
        resume = inp.resume
        if not (isinstance(resume, dict) and resume and all(_INTERRUPT_ID.fullmatch(str(k)) for k in resume)):
            # LangGraph applies a bare value to whatever single review is pending; docs/runtime.md promises strict
            raise BareResume(
                "answer a review by its interrupt id: Command(resume={run.pending_review()['interrupt_id']: "
                "decision}), or run.decide(decision); a bare Command(resume=...) would answer whatever review is "
                "pending")
        pending = [i.id for i in self._graph.get_state(config).interrupts]
        if len(pending) == 1 and list(resume) == pending:
            # checked here against the one pending review (this handle holds the run's lock, nothing else moves it),
            # then handed on as LangGraph's plain resume: an answer asked again in band (a malformed one, a question)
            # is then kept with the earlier ones, as the review node's loop expects
            return Command(graph=inp.graph, update=inp.update, goto=inp.goto, resume=_as_delivered(resume[pending[0]]))
        # another id: LangGraph's strict resume mode (the run's config) refuses it with UnknownInterruptError
        return Command(graph=inp.graph, update=inp.update, goto=inp.goto,
                       resume={k: _as_delivered(v) for k, v in resume.items()})

    def _check_stale(self, inp: Command, config: Any) -> None:
        if not ((config or {}).get("configurable") or {}).get("checkpoint_id"):
            return  # the thread's head: a pending review, answered normally
        saved = self._saver.get_tuple(config)
        stored = [value for _task, channel, value in (saved.pending_writes or [] if saved else [])
                  if channel == RESUME_CHANNEL]
        if stored:
            answer = stored[0][0] if isinstance(stored[0], list) and stored[0] else stored[0]
            what = answer.describe() if isinstance(answer, ReviewDecision) else (
                ReviewDecision.model_validate(answer).describe() if isinstance(answer, dict) else None)
            raise StaleResume(
                f"this checkpoint's review was already answered ({what or 'an answer is stored'}); LangGraph would "
                "replay that answer and ignore yours. Re-open the review with run.fork(snapshot), then answer it "
                "with run.decide(...)")

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        return self._graph.invoke(self._prepare(input, config), config, **kwargs)

    def stream(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        return self._graph.stream(self._prepare(input, config), config, **kwargs)


def open_run(run: str | Path, runs_dir: str | Path = "runs", *, api_key: str | None = None,
             lock: bool = True, allowed: Collection[str] = (), trust: bool = False) -> RunHandle:
    """Open a run by id (in ``runs_dir``) or path.

    Raises:
        RunNotFound, NotAMartRun: no such run / not a mart run.
        RunLocked: another process drives the run (with ``lock=True``).
    """
    store = RunStore.open(run, runs_dir)
    try:
        return RunHandle(store, api_key=api_key, lock=lock, allowed=allowed, trust=trust)
    except BaseException:
        store.close()
        raise
