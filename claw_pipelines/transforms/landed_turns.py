"""Rows completed with their turns' columns a chunk at a time, reading ``turns`` once.

``derived_schemas.with_turn_columns`` completes rows all at once. An export of a large batch
does better a chunk at a time: ``turns`` is read file by file in landing order (a read of the
next files runs while the caller writes the last chunk), and rows go out in the order asked
for as soon as every turn a chunk needs has been read. Rows asked for in about landing order (a
batch in group order: a group's rollouts land together) need little held back, so memory
follows a chunk rather than the batch, and a chunk whose turns were read in its order is taken
as read, with no token list copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from deltalake import DeltaTable

from claw_pipelines.derived_schemas import rows_at, started_within, with_turn_columns
from claw_pipelines.lake.files import ordered_files, plain_files, scan_files
from claw_pipelines.turn_prompts import read_columns, with_whole_prompts

MISSING = -1
"""Where a row's turn was not (yet) read."""


@dataclass
class _Read:
    """The turns read so far that rows still need: frames of ``columns`` holding only wanted
    turns, in read order, the first starting at ``start`` (rows before it were dropped), and
    per wanted row where its turn is among all rows held (``MISSING``: not yet read)."""

    wanted: int
    start: int = 0
    frames: list[pl.DataFrame] = field(default_factory=list)
    total: int = 0
    source: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.source = np.full(self.wanted, MISSING, dtype=np.int64)

    def add(self, frame: pl.DataFrame, turn_ids: pl.DataFrame) -> None:
        """``frame`` (``turn_id`` first) read next; ``turn_ids``: the wanted rows' ids with
        their ``_row``. A turn re-delivered under the same id counts once, its first read.
        Only the frame's wanted turns are kept, in the order of the rows that want them: a
        frame read whole in that order is kept as read, and a batch of a few turns spread
        over a long window holds those turns, not the window's token lists."""
        found = (
            frame.select("turn_id")
            .with_row_index("_at")
            .unique("turn_id", keep="first", maintain_order=True)
            .join(turn_ids, on="turn_id")
            .sort("_row")
        )
        fresh = found.filter(pl.Series(self.source[found.get_column("_row").to_numpy()] == MISSING))
        self.source[fresh.get_column("_row").to_numpy()] = self.total + np.arange(fresh.height)
        self.frames.append(rows_at(frame.drop("turn_id"), fresh.get_column("_at")))
        self.total += fresh.height

    def ready(self, since: int) -> int:
        """The end of the run of rows from ``since`` on whose turns were all read."""
        missing = np.flatnonzero(self.source[since:] == MISSING)
        return self.wanted if missing.size == 0 else since + int(missing[0])

    def take(self, begin: int, end: int) -> pl.DataFrame:
        """The turns of wanted rows ``begin:end`` (null where none was read), then drop the
        frames no later row needs."""
        at = pl.Series(self.source[begin:end] - self.start)
        taken = rows_at(pl.concat(self.frames, rechunk=False), at.set(at < 0, None))
        later = self.source[end:]
        needed = later[later != MISSING]
        keep_from = int(needed.min()) if needed.size else self.total
        while self.frames and self.start + self.frames[0].height <= keep_from:
            self.start += self.frames.pop(0).height
        return taken


def chunks_with_turn_columns(
    rows: pl.DataFrame,
    turns: DeltaTable | None,
    columns: list[str],
    *,
    chunk_starts: np.ndarray,
    chunk_rows: int,
) -> Iterator[pl.DataFrame]:
    """``rows`` (with ``turn_id`` and ``started_at``) and their turns' ``columns`` (as
    ``with_turn_columns`` gives them), in ``rows``' order, in chunks of at least
    ``chunk_rows`` rows (the last may hold fewer) that begin at one of ``chunk_starts``.

    ``turns`` is read in reads of about ``chunk_rows`` rows of its files, by their earliest
    ``started_at``, within the rows' time window; a table whose files cannot be read directly
    (``delta_files.plain_files``) is read whole, as one chunk. Prompts and request texts stored
    as what they add to an earlier turn come whole (``turn_prompts``)."""
    if rows.is_empty():
        return
    if turns is None or not plain_files(turns):
        yield with_turn_columns(rows, None if turns is None else pl.scan_delta(turns), columns)
        return
    window = started_within(rows.get_column("started_at"))
    available = [f.name for f in turns.schema().fields]
    reading = [name for name in read_columns(columns, available) if name != "turn_id"]
    reads = _reads(ordered_files(turns, "started_at", rows.get_column("started_at")), chunk_rows)
    turn_ids = rows.select("turn_id").with_row_index("_row")
    read = _Read(rows.height)

    def load(paths: list[str]) -> pl.DataFrame:
        return (
            scan_files(turns, paths)
            .filter(window)
            .select("turn_id", *reading)
            .collect(engine="in-memory")
        )

    def completed(begin: int, end: int) -> pl.DataFrame:
        chunk = rows.slice(begin, end - begin)
        stored = read.take(begin, end).insert_column(0, chunk.get_column("turn_id"))
        whole = with_whole_prompts(stored, pl.scan_delta(turns)).select(columns)
        return chunk.hstack(whole.get_columns())

    begin = 0
    with ThreadPoolExecutor(max_workers=1) as reader:
        pending = reader.submit(load, reads[0]) if reads else None
        for index in range(len(reads)):
            frame = pending.result()
            last = index == len(reads) - 1
            pending = None if last else reader.submit(load, reads[index + 1])
            read.add(frame, turn_ids)
            end = _chunk_end(chunk_starts, begin, read.ready(begin), rows.height)
            if end - begin >= chunk_rows and not last:
                yield completed(begin, end)
                begin = end
    if begin < rows.height:
        yield completed(begin, rows.height) if read.frames else _nulls(rows.slice(begin), columns)


def _chunk_end(starts: np.ndarray, begin: int, ready: int, total: int) -> int:
    """The furthest chunk start in ``(begin, ready]`` (``total`` when every row is ready),
    else ``begin``: a chunk ends where another may begin."""
    if ready >= total:
        return total
    later = starts[(starts > begin) & (starts <= ready)]
    return int(later[-1]) if later.size else begin


def _reads(files: pl.DataFrame, chunk_rows: int) -> list[list[str]]:
    """Consecutive files of about ``chunk_rows`` rows each (at least one file a read)."""
    reads: list[list[str]] = []
    rows = chunk_rows
    for path, count in files.select("path", "num_records").iter_rows():
        if rows >= chunk_rows:
            reads.append([])
            rows = 0
        reads[-1].append(path)
        rows += count or 0
    return reads


def _nulls(rows: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    return with_turn_columns(rows, None, columns)
