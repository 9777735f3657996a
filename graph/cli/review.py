"""`mart review`: answer a run's pending review from the command line or this terminal, then continue the run."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Optional

import typer

from mart.graph.cli.errors import fail, hint_ref, io_fail, one_line_errors
from mart.graph.cli.flags import (
    BACKEND_AGAIN,
    ENTRYPOINT_AGAIN,
    JSON,
    LLM_URL_AGAIN,
    RAY_ADDRESS_AGAIN,
    RUNS_DIR,
    TRUST_RUN,
    allowed,
)
from mart.graph.cli.output import finish
from mart.graph.cli.tune import interrupted


@one_line_errors
def review(
    run: str = typer.Argument(..., help="Run id or run directory."),
    runs_dir: Path = RUNS_DIR,
    approve_: bool = typer.Option(False, "--approve", help="Approve the pending candidate(s)."),
    reject: Optional[str] = typer.Option(None, "--reject", help="Reject with this feedback for the proposer."),
    edit: list[str] = typer.Option([], "--edit", help="Edit KEY=VALUE (repeatable), then run it."),
    ask: Optional[str] = typer.Option(None, "--ask", help="Ask the agents a question about the candidate(s); the "
                                      "review stays pending and shows their answer."),
    candidate: Optional[str] = typer.Option(
        None, "--candidate", help="The candidate (id from `mart status`) the decision is about, when the review "
        "covers several (one per free trial slot); default: all of them."),
    others: Optional[str] = typer.Option(
        None, "--others", help="With --candidate: what happens to the review's other candidates, approve or reject "
        "(default: you must decide them too, so none is approved unseen)."),
    reviewer: Optional[str] = typer.Option(None, help="Who decides (default: your user name)."),
    review_no: Optional[int] = typer.Option(
        None, "--review", help="Answer only if review #N is the pending one (scripts: never approve a review unseen)."),
    interrupt: Optional[str] = typer.Option(
        None, "--interrupt", help="Answer only if this interrupt id (from `mart status --json`) is pending."),
    backend: list[str] = BACKEND_AGAIN,
    verl_entrypoint: Optional[str] = ENTRYPOINT_AGAIN,
    llm_base_url: Optional[str] = LLM_URL_AGAIN,
    ray_address: Optional[str] = RAY_ADDRESS_AGAIN,
    trust_run: bool = TRUST_RUN,
    detach: bool = typer.Option(False, "--detach", help="After answering, exit again at the next review."),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    as_json: bool = JSON,
) -> None:
    """Answer a run's pending review (interactive without flags) and continue the run.

    Without flags the review is asked on this terminal, and so are the run's later reviews (unless
    --detach). With a flag, later reviews go to the run's own channel (--detach: exit at the next one).
    The decision applies only to the review shown (and to --review N / --interrupt ID when given): if
    another one is pending by the time it is applied, nothing changes.
    """
    import getpass
    import sys

    from mart.graph.reviewers.base import TTYReviewer, format_request
    from mart.graph.session import pending_review
    from mart.graph.session import resume as run_resume
    from mart.graph.stop import Interrupts
    from mart.state.config_values import parse_assignments
    from mart.state.models import CandidateDecision, ReviewDecision
    from mart.state.run_store import RunError, RunStore
    from mart.state.search_space import ConfigError

    chosen = [approve_, reject is not None, bool(edit), ask is not None]
    if sum(chosen) > 1:
        fail("give one of --approve, --reject, --edit or --ask")
    if others is not None and others not in ("approve", "reject"):
        fail(f"--others: approve or reject, not {others!r}")
    if others is not None and candidate is None:
        fail("--others goes with --candidate ID")
    who = reviewer or getpass.getuser()
    decision, channel, interrupts = None, None, Interrupts()
    out = sys.stderr if as_json else sys.stdout  # keep --json output clean
    try:
        store = RunStore.open(run, runs_dir, readonly=True)
        try:
            request = pending_review(store)
            state = (store.ledger.run(store.run_id) or {}).get("status")
        finally:
            store.close()
        if request is None:
            fail(f"run {store.run_id} ({state}) has no pending review (see `mart status {store.ref}`)")
        if review_no is not None and request.get("review_no") != review_no:
            fail(f"run {store.run_id}: the pending review is #{request.get('review_no')}, not #{review_no}; "
                  "nothing changed")
        if interrupt is not None and request["interrupt_id"] != interrupt:
            fail(f"run {store.run_id}: the pending review's interrupt is {request['interrupt_id']}, not "
                  f"{interrupt}; nothing changed")
        interrupt_id = request["interrupt_id"]
        ids = [c.get("candidate_id") for c in request.get("candidates") or []]
        if candidate is not None and candidate not in ids:
            fail(f"run {store.run_id}: review #{request.get('review_no')} has no candidate {candidate} "
                  f"(its candidates: {', '.join(map(str, ids))}); nothing changed")
        one = None
        if approve_:
            one = CandidateDecision(type="approve", candidate_id=candidate)
        elif reject is not None:
            one = CandidateDecision(type="reject", candidate_id=candidate, message=reject)
        elif edit:
            one = CandidateDecision(type="edit", candidate_id=candidate, edits=parse_assignments(edit))
        elif ask is not None:
            one = CandidateDecision(type="respond", candidate_id=candidate, message=ask)
            detach = True  # the review stays pending, with the agents' answer
        if one is not None:
            rest = [] if others is None else [CandidateDecision(type=others)]
            decision = ReviewDecision(decisions=[one, *rest], reviewer=who, channel="cli")
            if one.type != "respond" and candidate is not None and others is None and len(ids) > 1:
                rest_ids = ", ".join(str(c) for c in ids if c != candidate)
                fail(f"run {store.run_id}: review #{request.get('review_no')} also holds {rest_ids}: add "
                      "--others approve|reject to decide them in the same answer (or leave out --candidate to "
                      "decide all); nothing changed")
            if one.type != "respond":
                decision.for_candidates(ids)  # every candidate decided, before anything is sent
        if decision is not None:  # say what is being decided: the applied answer is pinned to this review
            out.write(format_request(request) + f"\n-> {decision.describe()} (interrupt {interrupt_id})\n")
            out.flush()
        else:  # interactive: ask now, answer exactly this review (unless someone else answers it first)
            tty = TTYReviewer(stdout=out)
            decision = tty.review(request)
            if decision is None:
                finish({"run_id": store.run_id, "status": "paused", "pending_review": request}, as_json, runs_dir)
                return
            if reviewer:
                decision = decision.model_copy(update={"reviewer": reviewer})
            channel = None if detach else tty
        with interrupts.installed():
            summary = run_resume(run, runs_dir, decision=decision, interrupt_id=interrupt_id, reviewer=channel,
                                 approve="none" if detach else None, quiet=quiet or None,
                                 allowed=allowed(backend, verl_entrypoint, llm_base_url, ray_address),
                                 trust=trust_run)
    except (RunError, ConfigError, ValueError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        interrupted(run, runs_dir, interrupts)
    except (OSError, sqlite3.Error) as e:
        io_fail(e, hint_ref(run, runs_dir))
    finish(summary, as_json, runs_dir)
