"""The files one export format writes for a batch, appended to a chunk of rows at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, Self


class Closable(Protocol):
    def close(self) -> None: ...


@dataclass
class OpenFile:
    handle: Closable
    """What the format appends with (a Parquet writer, a byte stream)."""
    description: str
    rows: int = 0


class ChunkedFiles:
    """A format's files of one batch, each opened at the first chunk that has it and appended to
    by the later ones; a context manager that closes them (a failed export leaves no file
    open). ``finish`` closes them and lists what the manifest records of each."""

    def __init__(self) -> None:
        self._files: dict[str, OpenFile] = {}

    def _opened(self, path: str, description: str, open_: Callable[[], Closable]) -> OpenFile:
        if path not in self._files:
            self._files[path] = OpenFile(open_(), description)
        return self._files[path]

    def finish(self) -> list[tuple[str, str, int]]:
        """Close the files; (path, description, rows) of each."""
        self.close()
        return [(path, file.description, file.rows) for path, file in self._files.items()]

    def close(self) -> None:
        for file in self._files.values():
            file.handle.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
