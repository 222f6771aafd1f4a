"""Disk faults for spool tests: a small tmpfs to put a spool on, and a ballast that fills it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``directory`` (needs root), unmounted afterwards; the test
    is skipped, saying why, where mounting is not permitted."""
    directory.mkdir(parents=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)]
    try:
        mounted = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("cannot mount a tmpfs for the spool here: no mount command")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the spool here: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


class Ballast:
    """Fills a file system but for ``leave_free`` bytes, as a disk that is nearly full: the
    spool's writes then fail whole or part way until a flush deletes committed segments.

    With ``spool``, the files under it (segments a flush will delete) count as free, so each
    flush leaves ``leave_free`` bytes however much happened to be spooled when the ballast came.
    """

    def __init__(self, path: Path, leave_free: int, spool: Path | None = None) -> None:
        self.path = path
        self.leave_free = leave_free
        self.spool = spool

    def __enter__(self) -> Ballast:
        chunk = b"\0" * 4096
        with self.path.open("ab", buffering=0) as file:
            with contextlib.suppress(OSError):
                while True:
                    file.write(chunk)
            free = max(0, self.leave_free - self._spooled_bytes())
            file.truncate(max(0, file.tell() - free))
        return self

    def _spooled_bytes(self) -> int:
        if self.spool is None:
            return 0
        size = 0
        for path in self.spool.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # committed meanwhile
                if path != self.path and path.is_file():
                    size += path.stat().st_size
        return size

    def __exit__(self, *_: object) -> None:
        self.path.unlink()
