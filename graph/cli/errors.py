"""How a command ends on a failure: one ``error:`` line naming the cause and the next step, and an exit code."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import typer


def os_cause(e: BaseException) -> str:
    """``FILE: cause`` of an OSError (or any error) on one line."""
    detail = getattr(e, "strerror", None) or str(e) or type(e).__name__
    where = getattr(e, "filename", None)
    return " ".join((f"{where}: {detail}" if where else f"{type(e).__name__}: {detail}").split())


def hint_ref(run: str | Path, runs_dir: str | Path) -> str:
    """How a hint names the run the user addressed as ``run`` in ``runs_dir`` (``RunStore.ref`` before it is open)."""
    from mart.state.run_store import run_ref

    return run_ref(Path(run) if Path(run).is_dir() else Path(runs_dir) / str(run), runs_dir)


def io_fail(e: BaseException, ref: str = "RUN") -> None:
    """A file-system or database failure (disk full, read-only, run folder deleted) as one line.

    The error that ended the session is named, not a later one raised while recording it ("database is
    locked": another connection still held the failed write), and a full disk is named as such."""
    first = e
    while first.__context__ is not None and isinstance(first.__context__, (OSError, sqlite3.Error)):
        first = first.__context__  # the failure that came first
    detail = getattr(first, "strerror", None) or str(first) or type(first).__name__
    where = getattr(first, "filename", None)
    full = "full" in detail.lower() or "no space" in detail.lower()
    fail(f"{type(first).__name__}: {detail}" + (f": {where}" if where else "")
          + (f"; the disk is full: free space, then `mart resume {ref}`" if full else
             f"; the run keeps its last checkpoint: fix the cause and `mart resume {ref}`"), 1)


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def one_line_errors(command):
    """A command whose stored state cannot be read (a damaged or foreign run folder: unparseable options,
    poisoned checkpoints, a damaged SQLite page) ends in one ``error:`` line naming the run and the cause, exit
    1, instead of a traceback; ``MART_DEBUG=1`` shows the traceback. Errors a command reports itself pass."""
    import functools

    @functools.wraps(command)
    def run_command(*args, **kwargs):
        import os

        import click

        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException,
                KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - see the docstring
            if os.environ.get("MART_DEBUG"):
                raise
            if isinstance(e, ImportError):
                # a package mart needs is missing from this environment: not the run folder's fault
                fail(f"{os_cause(e)[:300]}: mart's environment lacks a package it needs; reinstall mart with its "
                     "dependencies (`pip install -e .` in the checkout)", 1)
            what = kwargs.get("run") or kwargs.get("script")
            ref = hint_ref(kwargs["run"], kwargs.get("runs_dir") or "runs") if kwargs.get("run") else "RUN"
            fail(f"{f'{what}: ' if what else ''}{os_cause(e)[:400]} (stored state mart cannot read: a damaged "
                  f"or foreign file? `mart trials {ref}` / `mart export {ref}` read what they can; MART_DEBUG=1 shows "
                  "where)", 1)

    return run_command
