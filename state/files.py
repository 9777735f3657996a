"""Writing files inside a run folder without following a symbolic link someone planted there.

A run folder is untrusted input: ``report/best_so_far.png`` or ``trials/<id>/trial.log`` may be a symlink to
a file of the user's (``~/.bashrc``), and a plain ``open(path, "w")`` would overwrite its target. Every file
mart writes under a run folder or a trial directory goes through ``open_in`` / ``write_atomic``: each folder
below ``root`` is opened with ``O_NOFOLLOW | O_DIRECTORY`` (relative to its parent's descriptor, so a folder
swapped for a link between two steps is refused too), the file itself with ``O_NOFOLLOW``, and it must be a
regular file (a FIFO or a device is refused, not blocked on). ``write_atomic`` writes a new file under a
random name and renames it over the old one: the rename replaces a planted link, never its target.

``root`` itself is trusted (the run folder mart resolved, the trial directory it created).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MODES = {"w": os.O_TRUNC, "wb": os.O_TRUNC, "a": os.O_APPEND, "ab": os.O_APPEND}


class UnsafePath(OSError):
    """A path under a run folder is a symbolic link or not a regular file: mart does not write through it."""


def _refuse(path: Path, what: str) -> UnsafePath:
    return UnsafePath(errno.ELOOP, f"{what}: refusing to write through it (remove it if you did not make it)",
                      str(path))


def _parts(root: Path, path: str | os.PathLike) -> tuple[Path, list[str]]:
    p = Path(path)
    rel = p.relative_to(root) if p.is_absolute() else p
    parts = list(rel.parts)
    if not parts or any(x in ("..", "") for x in parts):
        raise ValueError(f"{path} is not a file inside {root}")
    return root / rel, parts


@contextlib.contextmanager
def _dir_fd(root: Path, parts: list[str], create: bool = True) -> Iterator[int]:
    """A descriptor of ``root/parts...`` reached without following links below ``root`` (made when missing)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = root
        for name in parts:
            here = here / name
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(here, "a symbolic link or not a folder") from None
                raise
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def ensure_dir(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``root/path`` as a real folder (made when missing); raises ``UnsafePath`` for a link on the way."""
    root = Path(root)
    full, parts = _parts(root, path)
    with _dir_fd(root, parts):
        pass
    return full


def _open_file(dfd: int, name: str, full: Path, flags: int) -> int:
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644, dir_fd=dfd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _refuse(full, "a symbolic link, a folder or a FIFO") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(full, "not a regular file")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def open_in(root: str | os.PathLike, path: str | os.PathLike, mode: str = "w", **kw: Any) -> IO[Any]:
    """Open ``path`` (absolute under ``root``, or relative to it) for writing (``w``/``wb`` truncate,
    ``a``/``ab`` append), following no symbolic link below ``root``; folders on the way are made. A link at
    ``path`` itself is replaced by a new file in ``w`` modes and refused in ``a`` modes.

    Raises:
        UnsafePath: a link (or a non-regular file) on the way; OSError: the file system's own errors.
    """
    if mode not in _MODES:
        raise ValueError(f"open_in writes only: mode must be one of {sorted(_MODES)}, got {mode!r}")
    root = Path(root)
    full, parts = _parts(root, path)
    with _dir_fd(root, parts[:-1]) as dfd:
        if _MODES[mode] == os.O_TRUNC:  # a new file anyway: a link there is removed (never followed)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISLNK(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode):
                    os.unlink(parts[-1], dir_fd=dfd)
        fd = _open_file(dfd, parts[-1], full, os.O_WRONLY | os.O_CREAT | _MODES[mode])
    return os.fdopen(fd, mode, **kw)


def write_atomic(root: str | os.PathLike, path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` under ``root`` at once: a new file under a random name, renamed over the old
    one (a reader never sees half of it; a planted link at ``path`` is replaced, its target untouched)."""
    root = Path(root)
    full, parts = _parts(root, path)
    tmp = f".{parts[-1]}.{secrets.token_hex(4)}.tmp"
    with _dir_fd(root, parts[:-1]) as dfd:
        fd = _open_file(dfd, tmp, full.with_name(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
            os.replace(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    return full


class InputFileError(ValueError):
    """An input file mart was asked to read is not a regular text file, or is over its size limit."""


def read_text_capped(path: str | os.PathLike, limit: int, what: str = "file") -> str:
    """The text of ``path``, which must be a regular file (after links: ``/dev/zero``, a FIFO or a folder is
    refused before anything is read) of at most ``limit`` bytes, in UTF-8.

    Raises:
        InputFileError: the rule it breaks, naming the file; OSError: it cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once, then is refused
    except IsADirectoryError:
        raise InputFileError(f"{what} {str(path)!r} is not a regular file (a folder)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputFileError(f"{what} {str(path)!r} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise InputFileError(f"{what} {str(path)!r} is {st.st_size} bytes, over the limit of {limit}")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(f"{what} {str(path)!r} is over the limit of {limit} bytes")
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, data.index(b"\0"), data.index(b"\0") + 1, "NUL byte")
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{what} {str(path)!r} is not a text file (binary data at byte {e.start})") from None


#: below this many free bytes, a failed write is blamed on a full disk
DISK_FULL_BYTES = 1 << 20


def disk_full(path: str | os.PathLike) -> str | None:
    """``"the disk holding PATH is full (N bytes free)"`` when its file system has (almost) no room left, else
    None: the cause to name when a write failed, instead of a symptom ("killed?", "disk I/O error")."""

    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return None
    return f"the disk holding {path} is full ({free} bytes free)" if free < DISK_FULL_BYTES else None


__all__ = ["DISK_FULL_BYTES", "InputFileError", "UnsafePath", "disk_full", "ensure_dir", "open_in", "read_text_capped",
           "write_atomic"]
