"""Where one batch's export files go: a folder under the lake, local or in an object store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.fs import DeltaStorageHandler
from pyarrow.fs import PyFileSystem

ROW_GROUP_BYTES = 64 << 20
"""About this much Arrow data per row group of an export file. pyarrow buffers a whole row
group before writing it, and one row group of a batch of every turn (pyarrow's default holds
up to 1M rows) grows buffers of hundreds of MB: the rollouts of 100k turns took 2.9-3.0 CPU s
in one row group, 1.5-1.8 in groups of 4k-32k rows (the kernel time of the growing buffers,
1.6 s, went to 0.2-0.4), the bytes within 0.02 %."""


STREAM_BUFFER = 8 << 20
"""Bytes a ``Destination.stream`` buffers between writes to the store."""


@dataclass(frozen=True)
class Destination:
    """A folder (local path or ``s3://…`` URI) that polars writes every file to, with the lake's
    storage options: polars and delta-rs share the object store and its option names, so exports
    land wherever the tables do."""

    root: str
    storage_options: dict[str, str] | None = None
    """The lake's delta-rs storage options (unused for a local root)."""

    def uri(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def parquet(self, frame: pl.DataFrame, name: str) -> None:
        frame.write_parquet(self.uri(name), storage_options=self.storage_options, mkdir=True)

    def arrow_parquet(self, table: pa.Table, name: str) -> None:
        """Write ``table`` whole (``parquet_writer``)."""
        with self.parquet_writer(name, table.schema) as writer:
            writer.write_table(table, row_group_size=row_group_rows(table))

    def parquet_writer(self, name: str, schema: pa.Schema) -> pq.ParquetWriter:
        """A pyarrow writer of ``name`` through delta-rs's store (local or object store alike):
        pyarrow keeps Arrow extension types, such as JSON tool-call arguments, that polars
        drops, and a batch can be written a chunk at a time. The numeric lists get no
        statistics: a token ID's min and max filter nothing, and computing them took ~8 % of
        the write (20k turns of 1,280 tokens). Give each ``write_table`` its
        ``row_group_rows``."""
        numeric_lists = [f.name for f in schema if _numeric_list(f.type)]
        others = [f.name for f in schema if f.name not in numeric_lists]
        return pq.ParquetWriter(
            name,
            schema,
            filesystem=self._store(),
            compression="zstd",
            use_dictionary=others,
            write_statistics=others,
            column_encoding=_list_encodings(schema),
        )

    def stream(self, name: str) -> ByteStream:
        """A binary output stream of ``name`` through delta-rs's store: a file written in
        parts (JSON lines a chunk at a time)."""
        return ByteStream(self._store().open_output_stream(name))

    def _store(self) -> PyFileSystem:
        if "://" not in self.root or self.root.startswith("file://"):  # the store needs it there
            Path(self.root.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        return PyFileSystem(DeltaStorageHandler(self.root, self.storage_options or None))

    def text(self, text: str, name: str) -> None:
        """Write ``text`` whole or not at all: the store stages the bytes and puts them under
        ``name`` on close (an object store's upload; a local file renamed into place), so a
        reader that sees ``name`` reads all of it. A manifest says an export is finished: a
        trainer that found one written in place read it empty."""
        stream = self.stream(name)
        stream.write(text.encode())
        stream.close()


class ByteStream:
    """Bytes written to a store's output stream in pieces smaller than ``STREAM_BUFFER``.
    delta-rs's stream takes only ``bytes``: pyarrow's buffered stream hands it its flushes as
    ``bytes``, but passes a write as large as its buffer straight through as a pyarrow
    ``Buffer``, which the store refuses."""

    def __init__(self, raw: pa.NativeFile) -> None:
        self._piece = max(STREAM_BUFFER // 2, 1)
        self._buffered = pa.BufferedOutputStream(raw, STREAM_BUFFER)

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for start in range(0, len(view), self._piece):
            self._buffered.write(view[start : start + self._piece])
        return len(view)

    def close(self) -> None:
        self._buffered.close()


def row_group_rows(table: pa.Table) -> int:
    """Rows per row group so that one holds about ``ROW_GROUP_BYTES`` of ``table``."""
    return max(1, table.num_rows * ROW_GROUP_BYTES // max(table.nbytes, 1))


def _numeric_list(kind: pa.DataType) -> bool:
    lists = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    lists = lists or pa.types.is_fixed_size_list(kind)  # verl's padded tensors
    return lists and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type))


def _list_encodings(schema: pa.Schema) -> dict[str, str]:
    """The encodings of the numeric lists (token IDs, logprobs): most of an export's bytes.
    Measured on 25.6M random token IDs (``bench/pipeline.py`` ``encodings``): delta encoding
    + zstd stores them in about the bytes dictionary encoding takes (``turns``), at a third
    of its CPU time; byte-stream split is the float counterpart. Both are Parquet 2 encodings
    that pyarrow, polars and Spark read."""
    return {
        f"{f.name}.list.element": "DELTA_BINARY_PACKED"
        if pa.types.is_integer(f.type.value_type)
        else "BYTE_STREAM_SPLIT"
        for f in schema
        if _numeric_list(f.type)
    }
