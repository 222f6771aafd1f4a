"""Where one batch's export files go: a folder under the lake, local or in an object store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.fs import DeltaStorageHandler
from pyarrow.fs import PyFileSystem


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
        """Write ``table`` with pyarrow through delta-rs's store (local or object store alike):
        it keeps Arrow extension types, such as JSON tool-call arguments, that polars drops."""
        if "://" not in self.root or self.root.startswith("file://"):  # the store needs it there
            Path(self.root.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        store = PyFileSystem(DeltaStorageHandler(self.root, self.storage_options or None))
        pq.write_table(table, name, filesystem=store)

    def ndjson(self, frame: pl.DataFrame, name: str) -> None:
        frame.lazy().sink_ndjson(self.uri(name), storage_options=self.storage_options, mkdir=True)

    def text(self, text: str, name: str) -> None:
        """Write ``text`` as is: a one-cell CSV without header, quotes or line end is the text
        itself, and polars' CSV sink is its one writer of any text to an object store."""
        pl.LazyFrame({"text": [text]}).sink_csv(
            self.uri(name),
            include_header=False,
            quote_style="never",
            line_terminator="",
            storage_options=self.storage_options,
            mkdir=True,
        )
