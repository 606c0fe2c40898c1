"""Exclusive locks on a run's files: a second run on the same output is refused at once, naming the file."""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from ..safe_write import open_regular_fd
from .runfiles import RunFileError

# --- locks ----------------------------------------------------------------------------------------
_HELD: set[Path] = set()                         # lock files this process holds (for unlink_held_locks)


def unlink_held_locks() -> None:
    """Remove the lock files this process holds (an exit at once; the kernel drops the locks themselves)."""
    for path in list(_HELD):
        try:
            os.unlink(path)
        except OSError:
            pass


class FileLock:
    """An exclusive, non-blocking flock on PATH.lock, held until release(); a second holder is refused at once."""

    def __init__(self, target: Path):
        self.target = Path(target)
        self.path = self.target.with_name(self.target.name + ".lock")
        self.fd: int | None = None

    def acquire(self) -> FileLock:
        while True:
            fd = open_regular_fd(self.path, os.O_RDWR | os.O_CREAT, "lock file")   # never a node (release unlinks)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunFileError(f"{self.target} is in use by another batchmask run (lock {self.path} is "
                                       f"held); wait for it to finish or use another --out") from None
                raise RunFileError(f"{self.path}: cannot lock ({e.strerror})") from None
            # the holder before us may have unlinked the file between our open and our flock: then retry
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                _HELD.add(self.path)
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())     # who holds it, for a curious user
                return self
            os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        _HELD.discard(self.path)
        try:
            os.unlink(self.path)                # while still held, so no one can be locking this inode
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
