"""The session driver: creates or opens a run, drives the graph, hands reviews to a reviewer channel.

One process drives a run at a time (the run's writer lock). The graph is checkpointed after every
node (``durability="sync"``), so a killed driver resumes where it stopped; trials run in their own
processes and are re-attached, not relaunched.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Mapping
from contextlib import closing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from rich.markup import escape

from mart.graph.eta import SessionEta
from mart.graph.progress_console import ConsoleProgress, tee_progress
from mart.graph.reviewers import Reviewer, make_reviewer

# a run's status, read from the ledger when it can (``mart status`` stays light): re-exported here
from mart.graph.run_status import (  # noqa: F401
    STRICT_RESUME,
    StudioRun,
    checkpoint_fingerprint,
    graph_config,
    recorded_snapshot,
    refuse_studio_run,
    review_request,
    run_status,
    state_snapshot,
    status_snapshot,
    studio_thread,
)
from mart.state.graph_state import running_trials
from mart.state.models import ReviewDecision
from mart.state.options import TuneOptions, backend_options
from mart.state.run_store import RunError, RunStore
from mart.trial_runner.registry import check_backend_options

if TYPE_CHECKING:
    from langgraph.types import Command

    from mart.nodes.runtime import Services

# LangGraph, the services and the tool nodes are imported where a graph runs (``_drive``, a review watched, a resume
# answer): importing them costs seconds (LangChain, LangSmith), which the refusals before a run (`mart tune --set
# lr=abc`, `mart review --edit micro_batch=abc`) need not pay (tests/graph/test_light_commands.py)


def __getattr__(name: str) -> Any:
    if name == "compile_graph":  # re-exported for the Slack server
        from mart.graph.builder import compile_graph

        return compile_graph
    if name == "build_services":
        from mart.graph.services import build_services

        return build_services
    raise AttributeError(name)

SUMMARY_KEYS = ("run_id", "status", "system", "learning", "trials", "notes", "agents")
#: summary keys present only when they apply (their stage ran, the session failed, several slots): the default
#: JSON is unchanged
OPTIONAL_SUMMARY_KEYS = ("schedule", "error", "parallel")


class StaleReview(RunError):
    """The decision answers a review that is no longer the pending one (already decided, or re-asked)."""


class UntrustedRun(RunError):
    """The run's stored options name code (a plugin backend, a launch command) the user has not allowed."""




def resume_command(interrupt_id: str, decision: ReviewDecision) -> Command:
    """The answer to one review, addressed to its interrupt: a stale answer is refused by LangGraph itself."""
    from langgraph.types import Command

    return Command(resume={interrupt_id: decision.model_dump(mode="json")})


def _drive(store: RunStore, options: TuneOptions, first_input: Any, reviewer: Reviewer,
           api_key: str | None, progress: ConsoleProgress) -> dict[str, Any]:
    from mart.graph.builder import compile_graph
    from mart.graph.services import build_services
    from mart.tools.watch import watchable

    reviewer.bind(store)
    services: Services = build_services(options, store, api_key=api_key)
    services.progress = tee_progress(progress, reviewer)
    saver = store.checkpointer()
    graph = compile_graph(saver)
    config = graph_config(store.run_id)
    ledger = store.ledger
    ledger.upsert_run(store.run_id, status="running", pid=os.getpid(), error=None)
    inp = first_input
    try:
        while True:
            for _ in graph.stream(inp, config, context=services, stream_mode="updates", durability="sync"):
                pass
            snap = graph.get_state(config)
            if not snap.next:
                summary = dict(snap.values.get("summary") or {})
                failure = session_failure(ledger.trials())
                if failure:  # nothing was measured because every trial crashed: the session failed
                    summary.update(status="failed", error=failure)
                    ledger.upsert_run(store.run_id, status="failed", summary=summary, error=failure)
                ledger.upsert_run(store.run_id, snapshot=status_snapshot(store, snap))  # `mart status` reads it
                if options.report:
                    summary["report"] = _write_report(store, progress)
                if summary.get("schedule"):
                    summary["schedule_file"] = _write_schedule(store, options, summary, progress)
                reviewer.on_finish(summary)
                return summary
            if not snap.interrupts:
                raise RunError(f"the graph stopped at {snap.next} without a pending review")
            request = review_request(snap)
            decision = _review_watching(reviewer, request, snap.values, lambda: nullcontext(services))
            if decision is None:
                ledger.upsert_run(store.run_id, status="paused", pid=None, snapshot=status_snapshot(store, snap))
                if not options.quiet:
                    progress.console.print(f"[yellow]paused at review #{request.get('review_no')}[/]: "
                                           f"answer with `mart review {escape(store.ref)}` (or from Slack/Studio)")
                    flying = watchable(running_trials(snap.values or {}))
                    if flying:
                        progress.console.print(f"{len(flying)} trial(s) in flight run on meanwhile: `mart watch "
                                               f"{escape(store.ref)}` keeps the health monitor on them")
                return {"run_id": store.run_id, "status": "paused", "pending_review": request}
            inp = resume_command(request["interrupt_id"], decision)
    except KeyboardInterrupt as e:
        ledger.upsert_run(store.run_id, status="paused", pid=None)
        e.run_id = store.run_id  # the CLI's hint names the run to resume
        raise
    except Exception as e:
        ledger.upsert_run(store.run_id, status="failed", pid=None, error=f"{type(e).__name__}: {e}")
        raise
    finally:
        services.close()
        saver.conn.close()  # the Slack server drives many runs in one process


def _review_watching(reviewer: Reviewer, request: dict[str, Any], values: Mapping[str, Any] | None,
                     services: Callable[[], ContextManager[Services]]) -> ReviewDecision | None:
    """``reviewer.review(request)``; while a person answers in this process, the trials in flight are watched
    (health stops, their steps into the ledger: ``WatchDuringReview``) with the ``services`` it opens only then."""
    running = running_trials(values or {}) if reviewer.waits else []
    if not running:
        return reviewer.review(request)
    from mart.tools.watch import WatchDuringReview

    with services() as side, WatchDuringReview(side, running):
        return reviewer.review(request)


def session_failure(trials: list[dict[str, Any]]) -> str | None:
    """Why a finished session failed, or None: no trial completed and some crashed (a session whose trials all ran
    out of memory completed: "no feasible config" is an answer; one whose trials all crashed measured nothing)."""
    if not trials or any(t["status"] == "completed" for t in trials):
        return None
    crashed = [t for t in trials if t["status"] == "failed"]
    if not crashed:
        return None
    first = crashed[0]
    return (f"no trial completed: {len(crashed)} of {len(trials)} failed, the first ({first['trial_id']}) with "
            f"{first.get('reason') or 'no reason'} (see its trial.log)")


def _write_report(store: RunStore, progress: ConsoleProgress) -> str | None:
    """The run's report.html; a report that cannot be drawn never fails a finished session."""
    from mart.graph.report import write_report

    try:
        return str(write_report(store.run_dir))
    except Exception as e:  # noqa: BLE001 - a plotting problem must not lose a completed run
        if not progress.quiet:
            progress.console.print(f"report not written: {type(e).__name__}: {e}", markup=False)
        return None


def _write_schedule(store: RunStore, options: TuneOptions, summary: dict[str, Any],
                    progress: ConsoleProgress) -> str | None:
    """The run's ``schedule.yaml`` (``mart.graph.export``); None when the stage found no complete schedule."""
    from mart.graph.export import render, schedule_document

    try:
        text = render(schedule_document(summary, options.model_dump(mode="json")))
    except ValueError:
        return None
    path = store.run_dir / "schedule.yaml"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    if not progress.quiet:
        progress.console.print(f"schedule: {path}", markup=False)
    return str(path)


def tune(options: TuneOptions, api_key: str | None = None, reviewer: Reviewer | None = None,
         run_id: str | None = None) -> dict[str, Any]:
    """Start a new session and drive it until it completes or pauses at a review.

    Returns:
        The summary dict (``SUMMARY_KEYS`` + notes, agents), or ``{"run_id", "status": "paused", ...}``.
    """
    # an option the backend does not take, or a --set the catalogue refuses, is refused before a run directory exists
    check_backend_options(options.backend, backend_options(options))
    options = preflight(options)
    reviewer = reviewer or make_reviewer(options.approve, auto_policy=options.auto_policy)
    store = RunStore.create(options.runs_dir, run_id, options=options.model_dump(mode="json"))
    started = False
    try:
        with store.lock():
            progress = ConsoleProgress(options.quiet, SessionEta.for_session(options))
            if not options.quiet:
                progress.console.print(f"[bold]mart[/] run {store.run_id} in {escape(str(store.run_dir))}")
            first = {"options": options.model_dump(mode="json"), "run_id": store.run_id, "run_dir": str(store.run_dir)}
            started = True
            return _drive(store, options, first, reviewer, api_key, progress)
    except Exception:
        if not _has_progress(store, started):
            # a start that failed before anything ran (bad plugin, missing model, ...): leave no run
            # folder behind that could only fail again on resume
            store.close()
            shutil.rmtree(store.run_dir, ignore_errors=True)
        raise
    finally:
        store.close()


def preflight(options: TuneOptions) -> TuneOptions:
    """What a session needs before its run folder exists: the backend's requirements (``RunError``: e.g. verl not
    installed) and its ``--set`` values (``check_start_overrides``); returns the options with those resolved."""
    from mart.trial_runner.registry import load_backend

    backend = load_backend(options.backend, **backend_options(options))
    missing = backend.missing_requirement()
    if missing:
        raise RunError(missing)
    if not options.start_overrides:
        return options
    return options.model_copy(update={"start_overrides": check_start_overrides(backend, options.start_overrides)})


def check_start_overrides(backend: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """``--set`` values against the backend's catalogue: a knob's name (key, dotted suffix or short name) becomes its
    key and its value is checked by the knob's rule; a name that is no knob must be a key of the backend's base config
    (or one the backend takes as the user's own, as verl's Hydra keys), else it is refused with the closest knobs.
    ``ConfigError`` names every bad key at once."""
    from mart.state.search_space import ConfigError

    space, base = backend.search_space(), backend.base_config()
    out: dict[str, Any] = {}
    errors: list[str] = []
    for name, value in overrides.items():
        if name in base and name not in space:
            out[name] = value
            continue
        try:
            key = space.resolve_key(name)
        except ConfigError as e:
            if hasattr(backend, "extend_base"):  # verl, MARTI: any key of the trainer's config is the user's own
                out[name] = value
            else:
                errors.append(f"--set {name}: {e}")
            continue
        try:
            out[key] = space[key].validate(value)
        except ConfigError as e:
            errors.append(f"--set {name}: {e}")
    if not errors:  # the backend's own rules on the whole config (batch arithmetic, ...) for the keys set here
        errors = [f"--set: {e}" for e in backend.validate_config({**base, **out}) if any(k in e for k in out)]
    if errors:
        raise ConfigError("; ".join(errors) + " (see `mart knobs`)")
    return out


def _has_progress(store: RunStore, started: bool) -> bool:
    """Whether the run got far enough to be worth resuming (a checkpoint or a trial)."""
    if not started:
        return False
    try:
        if store.ledger.trials():
            return True
        return bool(state_snapshot(store).values)
    except Exception:
        return True  # cannot tell: keep it


def load_options(store: RunStore, *, allowed: Collection[str] = (), trust: bool = False,
                 **overrides: Any) -> TuneOptions:
    """The run's stored options (plus ``overrides``), refused when they name code the user did not allow.

    Args:
        allowed: backend specs, launch commands and endpoints (``llm_base_url``, ``ray_address``) the user
            allows (``--backend`` / ``--llm-base-url`` again, a server's allow-list), besides those in
            ``$MART_ALLOWED_BACKENDS``; builtin backends without a launch command or endpoint need none.
        trust: the user vouches for the run folder (``--trust-run``).

    Raises:
        UntrustedRun: a plugin spec or command not in ``allowed``; RunError: options that do not parse.
    """
    from pydantic import ValidationError

    from mart.trial_runner.registry import allowed_from_env, untrusted_parts

    refuse_studio_run(store, "continue it")
    try:
        row = store.ledger.run(store.run_id) or {}
    except ValueError as e:  # the ledger's JSON columns do not parse
        raise RunError(f"run {store.run_id}: its stored options are not valid JSON ({e})") from None
    data = row.get("options")
    if not isinstance(data, dict):
        raise RunError(f"run {store.run_id}: its stored options are missing or not a JSON object")
    data = dict(data)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        options = TuneOptions(**data)
    except (ValidationError, TypeError) as e:
        raise RunError(f"run {store.run_id}: its stored options are invalid ({str(e).splitlines()[0]})") from None
    allowed = allowed_from_env(allowed)
    parts = [] if trust else untrusted_parts(options.backend, options.backend_options, allowed)
    # the LLM endpoint gets the user's API key: a URL the folder names is used only when named in this process
    url = options.llm_base_url
    uses_llm = "llm" in (options.proposer_strategy(), options.critic_strategy())
    if (not trust and uses_llm and url and overrides.get("llm_base_url") != url and url not in allowed
            and url != os.environ.get("OPENAI_BASE_URL")):
        parts.append(f"endpoint llm_base_url={url!r} (given `--llm-base-url` again, it gets your API key)")
    if parts:
        raise UntrustedRun(
            f"run {store.run_id} names {', '.join(parts)}: a run folder could have been written by anyone, so "
            "code and endpoints it names are used only when you name them again (`--backend SPEC` / "
            "`--verl-entrypoint CMD` / `--llm-base-url URL` / `--ray-address ADDR` with the same value, or "
            "`--trust-run`; servers: `--allow-backend` or $MART_ALLOWED_BACKENDS)")
    return options


def resume(run: str | Path, runs_dir: str | Path = "runs", *, api_key: str | None = None,
           reviewer: Reviewer | None = None, decision: ReviewDecision | None = None,
           interrupt_id: str | None = None, allowed: Collection[str] = (), trust: bool = False,
           **option_overrides: Any) -> dict[str, Any]:
    """Continue a run: after a crash, a Ctrl-C, or a pause (``decision`` answers the pending review).

    Args:
        interrupt_id: answer only if this is still the pending review's interrupt (checked under the
            run's writer lock); else ``StaleReview``. Channels that answer asynchronously (Slack) use it.
        allowed, trust: which code named by the run's stored options may run (see ``load_options``).
    """
    store = RunStore.open(run, runs_dir)
    try:
        with store.lock():
            options = load_options(store, allowed=allowed, trust=trust, **option_overrides)
            if decision is not None:
                check_edit_values(store, options, decision)
            status = (store.ledger.run(store.run_id) or {}).get("status")
            row = store.ledger.run(store.run_id) or {}
            if status == "completed" or (status == "failed" and (row.get("summary") or {}).get("status") == "failed"):
                if decision is not None:
                    raise RunError(f"run {store.run_id} is completed: there is no review to answer")
                row = store.ledger.run(store.run_id) or {}
                return row.get("summary") or {"run_id": store.run_id, "status": "completed"}
            reviewer = reviewer or make_reviewer(options.approve, auto_policy=options.auto_policy)
            progress = ConsoleProgress(options.quiet, SessionEta.for_session(options, store.ledger.trials()))
            snap = state_snapshot(store)
            check_graph_version(store, snap)
            if interrupt_id is not None and (not snap.interrupts or snap.interrupts[0].id != interrupt_id):
                raise StaleReview(f"run {store.run_id}: review {interrupt_id} is no longer pending "
                                  "(already decided, or asked again)")
            if decision is not None:
                if not snap.interrupts:
                    raise RunError(f"run {store.run_id} has no pending review to answer")
                validate_decision(store, options, snap, decision)
                first: Any = resume_command(snap.interrupts[0].id, decision)
            elif snap.interrupts:
                reviewer.bind(store)
                request = review_request(snap)
                # no session services yet (``_drive`` builds them): the watch, if any, gets its own
                from mart.graph.services import build_services

                answer = _review_watching(reviewer, request, snap.values,
                                          lambda: closing(build_services(options, store, api_key=api_key)))
                if answer is None:
                    store.ledger.upsert_run(store.run_id, status="paused", pid=None, snapshot=status_snapshot(store, snap))
                    return {"run_id": store.run_id, "status": "paused", "pending_review": request}
                first = resume_command(request["interrupt_id"], answer)
            elif not snap.values:
                # killed between creating the run and its first checkpoint: nothing ran yet, start it now
                first = {"options": options.model_dump(mode="json"), "run_id": store.run_id,
                         "run_dir": str(store.run_dir)}
            else:
                first = None  # continue from the last checkpoint (re-attaches a running trial)
            if not options.quiet:
                progress.console.print(f"[bold]mart[/] resuming run {escape(store.run_id)}")
            return _drive(store, options, first, reviewer, api_key, progress)
    finally:
        store.close()


def check_graph_version(store: RunStore, snap) -> None:
    """Refuse a run whose checkpoints another shape of the graph wrote (a mart before parallel trials): its state
    would be misread. Its ledger stays readable (``mart trials``, ``report``, ``export``)."""
    from mart.state.graph_state import GRAPH_VERSION

    version = (snap.values or {}).get("graph_version")
    if snap.values and version != GRAPH_VERSION:
        raise RunError(f"run {store.run_id} was started by an older mart (graph version {version or 1}, this one "
                       f"is {GRAPH_VERSION}): it cannot be continued here; its trials and results stay readable with "
                       f"`mart trials {store.ref}`, `mart report {store.ref}` and `mart export {store.ref}`")


def validate_decision(store: RunStore, options: TuneOptions, snap, decision: ReviewDecision) -> None:
    """Refuse a decision the review node would refuse, before it reaches the graph (``ConfigError`` /
    ``ValueError`` naming the candidate, the key and the rule): an unknown or undecided candidate, an invalid
    edit."""
    batch = snap.values.get("batch")
    picks = list(batch.picks) if batch is not None else []
    if not any(d.type == "edit" for d in decision.decisions):
        decision.for_candidates([c.candidate_id for c in picks])
        return
    from types import SimpleNamespace

    from mart.nodes.human_review import check_decision, review_base
    from mart.trial_runner.registry import load_backend

    backend = load_backend(options.backend, **backend_options(options))
    # the review node's own base (the stage's policy), from the paused state without building the services
    view_services = SimpleNamespace(options=options, ledger=store.ledger, backend=backend)
    check_decision(decision, picks, backend.search_space(), snap.values["stage"],
                   review_base(snap.values, view_services))


def pending_review(store: RunStore) -> dict[str, Any] | None:
    """The pending review request of a run (with its ``interrupt_id``), or None: from the ledger's record of the last
    stop while it is current and no driver moves the run (no LangGraph import), else from the graph."""
    refuse_studio_run(store, "read its reviews")
    recorded = None if store.lock_holder() else recorded_snapshot(store)
    if recorded is not None:
        return recorded["pending_review"]
    return review_request(state_snapshot(store))


def check_edit_values(store: RunStore, options: TuneOptions, decision: ReviewDecision) -> None:
    """The edits' keys and values by the knob catalogue (``ConfigError``), before the graph is loaded: a bad value is
    refused at once. ``validate_decision`` then checks the whole decision against the graph's state (the candidates,
    the config's constraints) with the same rules."""
    edits = [d for d in decision.decisions if d.type == "edit" and d.edits]
    if not edits:
        return
    from mart.trial_runner.registry import load_backend

    stage = (recorded_snapshot(store) or {}).get("stage")
    space = load_backend(options.backend, **backend_options(options)).search_space()
    for d in edits:
        space.validate_overrides(space.resolve_keys(d.edits), stage=stage)
