"""A run directory: one SQLite file for LangGraph's checkpoints and the ledger, a writer lock, trial dirs.

Layout::

    <runs_dir>/<run_id>/mart.sqlite    checkpoints (langgraph-checkpoint-sqlite) + ledger (sqlite-utils)
    <runs_dir>/<run_id>/lock           held (flock) by the one process driving the run; holds its pid
    <runs_dir>/<run_id>/watch.lock     held by a `mart watch` of a paused run's trials in flight; holds its pid
    <runs_dir>/<run_id>/trials/<id>/   one directory per trial (metrics.jsonl, status.json, trial.log)
"""

from __future__ import annotations

import difflib
import fcntl
import os
import secrets
import shlex
import shutil
import sqlite3
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mart.state.files import UnsafePath, disk_full, ensure_dir
from mart.state.ledger import DB_FILE, Ledger, connect_readonly


class RunError(Exception):
    """A run cannot be opened or driven; the message says why and what to do."""


class RunNotFound(RunError):
    pass


class NotAMartRun(RunError):
    pass


class RunLocked(RunError):
    pass


#: the lock file of a watch outside any driver (``mart watch``): drivers never wait for it
WATCH_LOCK = "watch.lock"


class RunOutsideRunsDir(RunNotFound):
    """A run reference that resolves outside the runs directory (a path elsewhere, ``..``, a symlink)."""


class DamagedLedger(RunError):
    """The run's SQLite file fails its integrity check: mart does not write into it."""


class LedgerBehind(RunError):
    """Trial folders hold results the ledger does not know (its newest writes were lost, e.g. with the -wal)."""


def _damage_report(db: Path) -> str | None:
    """The first problem ``PRAGMA integrity_check`` finds in ``db`` (read-only), or None when it is sound.

    https://www.sqlite.org/pragma.html#pragma_integrity_check
    """
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            rows = conn.execute("PRAGMA integrity_check(5)").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        return str(e)
    problems = [r[0] for r in rows if r and r[0] != "ok"]
    return "; ".join(problems) if problems else None


def run_ref(run_dir: str | Path, runs_dir: str | Path = "runs") -> str:
    """How a command line names a run again: its folder's name, plus ``--runs-dir`` (as the user spelled it) unless
    the run lies in ./runs, the default. A hint without it would address another run of the same name."""
    home = Path(run_dir).resolve().parent
    name = shlex.quote(Path(run_dir).name)
    if home == Path("runs").resolve():
        return name
    spelled = str(runs_dir) if Path(runs_dir).resolve() == home else str(home)
    return f"{name} --runs-dir {shlex.quote(spelled)}"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class RunStore:
    """Paths and connections of one run. ``open`` validates that the directory really is a mart run."""

    def __init__(self, run_dir: Path, run_id: str, *, readonly: bool = False,
                 runs_dir: str | Path | None = None) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.readonly = readonly
        #: how a command line names this run again (hints print it): see ``run_ref``
        self.ref = run_ref(run_dir, run_dir.parent if runs_dir is None else runs_dir)
        self.db_path = run_dir / DB_FILE
        self._lock_fd: int | None = None
        self._ledger: Ledger | None = None

    # -- creation and lookup ----------------------------------------------------------------------
    @classmethod
    def create(cls, runs_dir: str | Path, run_id: str | None = None, **fields: Any) -> "RunStore":
        """Make a new run directory with its database and ``fields`` (e.g. ``options``) in the ledger.

        The directory is built under a hidden temporary name and renamed into place once complete, so a
        crash or a kill never leaves a run folder without its database and options.
        """
        run_id = run_id or new_run_id()
        root = Path(runs_dir).resolve()
        if root.exists() and not root.is_dir():
            raise RunError(f"--runs-dir {runs_dir} is not a directory")
        run_dir = root / run_id
        if run_dir.exists():
            raise RunError(f"run directory {run_dir} already exists")
        tmp = root / f".new-{run_id}-{secrets.token_hex(3)}"
        try:
            (tmp / "trials").mkdir(parents=True)
        except OSError as e:
            raise RunError(f"cannot create the run directory in {root}: {e.strerror or e}") from None
        building = cls(tmp, run_id)
        try:
            building.ledger.upsert_run(run_id, status="created", **fields)
            building.close()  # SQLite reopens its -wal/-shm by path: close before the rename
            os.rename(tmp, run_dir)
        except (OSError, sqlite3.Error) as e:
            building.close()
            _remove_tree(tmp)
            if isinstance(e, OSError) and run_dir.exists():
                raise RunError(f"run directory {run_dir} already exists") from None
            raise RunError(f"cannot write the run's database in {root}: {e}") from None
        return cls(run_dir, run_id, runs_dir=runs_dir)

    @classmethod
    def open(cls, ref: str | Path, runs_dir: str | Path = "runs", *, readonly: bool = False,
             contained: bool | None = None) -> "RunStore":
        """Open a run by id (looked up in ``runs_dir``) or by its directory's path.

        ``readonly``: open the database read-only (status on read-only media). ``contained`` (default: not
        ``readonly``): the run must lie in ``runs_dir`` (symlinks followed first), so a folder elsewhere is
        never driven by accident; a read-only look (status, trials, report) may name any run folder.

        Raises:
            RunNotFound: no such run; RunOutsideRunsDir: a path outside ``runs_dir``.
            NotAMartRun: the directory's SQLite file is missing, corrupted or not written by mart.
            DamagedLedger: opened for writing, and the file fails SQLite's integrity check.
        """
        root = Path(runs_dir).resolve()
        # a bare id names a run in runs_dir only: a same-named folder where the command runs is never taken for it
        # (`mart status RUN --runs-dir other` showed ./RUN); a folder elsewhere is named by its path (./RUN, /x/RUN)
        bare = isinstance(ref, str) and "/" not in ref and os.sep not in ref and ref not in (".", "..")
        candidates = [Path(runs_dir) / ref] if bare else [Path(ref), Path(runs_dir) / str(ref)]
        run_dir = next((p for p in candidates if p.is_dir()), None)
        if run_dir is None:
            known = sorted(p.name for p in Path(runs_dir).glob("*") if (p / DB_FILE).exists()) if root.is_dir() else []
            # a mistyped id: the nearest one (run ids share their date, so only the closest is named)
            near = difflib.get_close_matches(str(ref), known, n=1, cutoff=0.6)
            hint = (f" Did you mean {near[0]}?" if near else
                    f" Newest runs in {runs_dir}: {', '.join(known[-5:])}." if known else f" No runs in {runs_dir}.")
            where = f"looked in {runs_dir}/; a run folder elsewhere: give its path, e.g. ./{ref}" if bare else \
                f"looked in {runs_dir}/ and as a path"
            raise RunNotFound(f"no run {str(ref)!r} ({where}).{hint}")
        run_dir = run_dir.resolve()
        if (not readonly if contained is None else contained) and run_dir.parent != root:
            raise RunOutsideRunsDir(f"{ref} is not a run directory inside --runs-dir {runs_dir} (it resolves to "
                                    f"{run_dir}); pass the folder that holds it as --runs-dir")
        db = run_dir / DB_FILE
        if not db.exists():
            raise NotAMartRun(f"{run_dir} is not a mart run: {DB_FILE} is missing")
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                rows = conn.execute("SELECT run_id FROM runs").fetchall() if "runs" in tables else []
            finally:
                conn.close()
        except sqlite3.DatabaseError as e:
            full = disk_full(db)
            if full:  # SQLite says "disk I/O error" when it cannot map its -shm: the cause is the disk
                raise RunError(f"cannot open {db}: {full}; free space, then run the command again") from None
            raise NotAMartRun(f"{db} is not a readable mart database ({e})") from None
        if "runs" not in tables or "trials" not in tables:
            raise NotAMartRun(f"{db} is an SQLite file, but not a mart run (no ledger tables)")
        if len(rows) != 1:  # mart writes exactly one: the folder was edited or put together by hand
            ids = ", ".join(repr(str(r[0]))[:40] for r in rows[:3]) + (", ..." if len(rows) > 3 else "")
            raise NotAMartRun(f"{db} holds {len(rows)} rows in its runs table ({ids or 'none'}); a mart run holds "
                              "exactly one, so which run this folder is cannot be told")
        store = cls(run_dir, rows[0][0], readonly=readonly, runs_dir=runs_dir)
        if not readonly:
            store._check_writable(db)
        return store

    def _check_writable(self, db: Path) -> None:
        """Refuse to write into a damaged ledger, or one that lost writes its trial folders prove it made."""
        run_id = self.run_id
        damage = _damage_report(db)  # a write into a damaged file spreads the damage: refuse, say what can be read
        if damage:
            raise DamagedLedger(
                f"{db} is damaged (SQLite's integrity check: {' '.join(damage.split())[:300]}); mart does not "
                f"write into a damaged ledger. What it still holds can be read: `mart trials {self.ref}`, "
                f"`mart export {self.ref}` and `mart status {self.ref}` open it read-only; keep a copy of "
                "the folder, and `sqlite3 mart.sqlite .recover` rebuilds what SQLite can save")
        lost = self.untracked_trials()
        if lost:
            raise LedgerBehind(
                f"run {run_id}: trial folders hold results its ledger does not know ({', '.join(lost[:5])}"
                f"{', ...' if len(lost) > 5 else ''}): the ledger lost its newest writes (mart.sqlite-wal deleted "
                "or truncated after a kill?), and continuing would run those trials again over their files. "
                "Put the -wal file back if you have it; the folders keep the trials' own results")

    def untracked_trials(self) -> list[str]:
        """Trial folders with files in them that the ledger has no row for, each with what it holds.

        ``launch_trial`` writes a trial's row before anything is written into its folder (an empty folder is a
        kill between the two), so a folder with files but no row means the ledger lost writes it had made.
        """
        folder = self.run_dir / "trials"
        try:
            present = {p.name: p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()}
        except OSError:
            return []
        if not present:
            return []
        conn = connect_readonly(self.db_path)
        try:
            known = {r[0] for r in conn.execute("SELECT trial_id FROM trials")}
        except sqlite3.DatabaseError:
            return []
        finally:
            conn.close()
        out = []
        for name in sorted(set(present) - known):
            files = [p.name for p in present[name].iterdir()] if present[name].is_dir() else []
            if files:
                out.append(f"{name} ({'finished' if 'status.json' in files else 'started'})")
        return out

    # -- resources --------------------------------------------------------------------------------
    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(self.db_path, readonly=self.readonly)
        return self._ledger

    def checkpointer(self):
        """A SqliteSaver on the run's file (one writer process: guard with ``lock``)."""
        # LangGraph only for a checkpointer: `mart status` and the run listing read the ledger alone
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415

        from mart.state.serde import make_serde  # noqa: PLC0415 - imports LangGraph's serializer

        if self.readonly:
            conn = connect_readonly(self.db_path)
            saver = SqliteSaver(conn, serde=make_serde())
            saver.is_setup = True  # setup() writes (journal mode, tables); a mart run has them already
            return saver
        conn = sqlite3.connect(self.db_path, check_same_thread=False, timeout=30)
        return SqliteSaver(conn, serde=make_serde())

    def trial_dir(self, trial_id: str) -> Path:
        """The trial's folder, made when missing; a folder the run holds as a link (elsewhere) is refused, so
        that nothing a trial writes lands outside the run."""

        try:
            return ensure_dir(self.run_dir, Path("trials") / trial_id)
        except UnsafePath as e:
            raise RunError(f"{e.filename} is a symbolic link or not a folder: refusing to use it as a trial "
                           "folder (remove it if you did not make it)") from None

    # -- one writer per run -----------------------------------------------------------------------
    @contextmanager
    def lock(self, file: str = "lock") -> Iterator[None]:
        """Hold the run's writer lock (non-blocking): a second driver gets ``RunLocked`` at once. ``file=WATCH_LOCK``:
        the lock of a watch outside any driver (``mart watch``), one at a time, which no driver waits for."""
        path = self.run_dir / file
        fd = _open_lock(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.lock_holder(file)
            raise RunLocked(
                f"run {self.run_id} is already "
                + ("being driven by another process" if file == "lock" else "watched by another `mart watch`")
                + (f" (pid {holder})" if holder else "") + ("; one writer per run." if file == "lock" else ".")
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        if file == "lock":
            self._lock_fd = fd
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            if file == "lock":
                self._lock_fd = None

    def lock_holder(self, file: str = "lock") -> int | None:
        """Pid of the process driving the run now (``file=WATCH_LOCK``: watching it), or None when nobody holds
        the lock."""
        path = self.run_dir / file
        if not path.exists() and not path.is_symlink():
            return None
        # read-only: ``mart status`` must work on read-only media; flock needs no write access
        fd = _open_lock(path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None


def _open_lock(path: Path, flags: int) -> int:
    """Open the run's lock file, refusing a symlink (else truncating it would empty the file it points to)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        if path.is_symlink():
            raise RunError(f"{path} is a symbolic link: refusing to use it as the run's lock "
                           "(remove it if you did not make it)") from None
        raise RunError(f"cannot open the run's lock {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunError(f"{path} is not a regular file: refusing to use it as the run's lock")
    return fd


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
