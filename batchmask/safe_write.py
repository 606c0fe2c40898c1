"""The one rule for every file batchmask writes: only a regular file is ever created, appended to or replaced.

Every writer (result files and their parts, OUT.run.json, lock files, the grammar cache, `compile --out`,
`grammar.save`, the checkpoint writer) goes through here:

    check_target(path, what)     refuses a path that exists and is not a regular file: a device node (as root,
                                 `--out /dev/null --force` would otherwise replace the system's /dev/null), a
                                 FIFO or socket (opening one for writing blocks or writes elsewhere), a directory
                                 -- with or without --force, naming the path and what it is
    write_atomic(path, fill)     writes through a temporary file in the same directory (so the rename cannot
                                 cross file systems), fsyncs it, then os.replace; on any failure the temporary
                                 file is removed and the target is untouched
    open_append(path) / open_regular_fd(path)
                                 for files written line by line (a result file) or locked (a lock file): opened
                                 with O_NOFOLLOW and checked with fstat after opening, so a node that appears
                                 between the check and the open is still refused

Symbolic links are refused, never followed or replaced: writing the link's target would change a file the user
named only indirectly, and replacing the link would silently break it. Pass the target's own path instead.

OSError becomes OutputPathError: one line naming the path and what to do (read-only file system, disk full,
permission denied).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class OutputPathError(ValueError):
    """A path batchmask was asked to write that it must not (or cannot) write; the message names it."""


class NotRegularFileError(OutputPathError):
    """The path exists and is a device, FIFO, socket, directory or symbolic link: never written or replaced."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))

_ADVICE = {errno.EROFS: "the file system is read-only; write it elsewhere",
           errno.ENOSPC: "no space left on the device; free some space or write it elsewhere",
           errno.EDQUOT: "the disk quota is exceeded; free some space or write it elsewhere",
           errno.EACCES: "permission denied; write it elsewhere",
           errno.EPERM: "permission denied; write it elsewhere",
           errno.ENOENT: "its directory does not exist; create it first",
           errno.ENOTDIR: "a part of its directory path is not a directory"}


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _label(what: str, path) -> str:
    return f"{what} {path}" if what else str(path)


def check_target(path, what: str = "") -> None:
    """Refuse (OutputPathError) `path` if it exists and is anything but a regular file (a link included)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise os_error(path, e, what) from None
    if not stat.S_ISREG(st.st_mode):
        hint = "; pass the target's own path" if stat.S_ISLNK(st.st_mode) else ""
        raise NotRegularFileError(f"{_label(what, path)}: is {kind_of(st.st_mode)}, not a regular file; batchmask "
                                  f"only writes regular files (with or without --force){hint}")


def os_error(path, e: OSError, what: str = "") -> OutputPathError:
    """An OSError while writing `path` as one line naming the path and what to do."""
    reason = e.strerror or type(e).__name__
    advice = _ADVICE.get(e.errno)
    return OutputPathError(f"{_label(what, path)}: cannot write ({reason}){'; ' + advice if advice else ''}")


def write_atomic(path, fill, what: str = "") -> None:
    """Write `path` as a whole: `fill(tmp_path)` writes a temporary file beside it, which then replaces `path`."""
    path = Path(path)
    check_target(path, what)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        check_target(tmp, what)
        fill(tmp)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        check_target(path, what)               # nothing replaced it with a node meanwhile
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise os_error(path, e, what) from None
    except BaseException:
        _remove(tmp)
        raise


def write_text_atomic(path, text: str, what: str = "") -> None:
    def fill(tmp: Path) -> None:
        with open(tmp, "x", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    write_atomic(path, fill, what)


def _remove(tmp: Path) -> None:
    try:
        if os.path.lexists(tmp) and stat.S_ISREG(os.lstat(tmp).st_mode):
            os.unlink(tmp)
    except OSError:
        pass


def open_regular_fd(path, flags: int, what: str = "", mode: int = 0o644) -> int:
    """os.open(path, flags) refusing anything but a regular file, links included (checked after opening too)."""
    check_target(path, what)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)   # O_NONBLOCK: a FIFO never hangs us
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):                         # a link or FIFO appeared meanwhile
            check_target(path, what)
        raise os_error(path, e, what) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFileError(f"{_label(what, path)}: is {kind_of(st.st_mode)}, not a regular file; batchmask "
                                  f"only writes regular files (with or without --force)")
    os.set_blocking(fd, True)
    return fd


def open_append(path, append: bool, what: str = ""):
    """A text file to write line by line: appended to (append) or started empty, a regular file only."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = open_regular_fd(path, flags, what)
    return os.fdopen(fd, "a" if append else "w", encoding="utf-8", newline="\n")


def unlink_regular(path, what: str = "") -> None:
    """Remove `path` if it is a regular file (refusing anything else: a node is never removed for us)."""
    check_target(path, what)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise os_error(path, e, what) from None
