"""A Delta table's data files read by polars directly, in an order chosen by their statistics.

``pl.scan_delta`` reads files in the order delta-rs lists them: newest commit first. A landing
table is appended in time order, so reading its files by their earliest ``started_at`` gives
its rows in about the order they landed; a reader that needs them in that order (a batch's
rows, put in group order, are about the order their turns landed in) then finds them in place
and copies no token list to reorder them.

Only a table whose files hold its rows as they are may be read this way: no partition columns
(their values live in the log, not the files) and no reader features (deletion vectors, column
mapping). Every table this project writes is such a table; any other is left to
``pl.scan_delta``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
from deltalake import DeltaTable

from claw_pipelines.lake.filters import floor_ms


def plain_files(delta_table: DeltaTable) -> bool:
    """Whether the table's data files hold its rows as they are (see the module docstring)."""
    protocol = delta_table.protocol()
    return (
        protocol.min_reader_version == 1
        and not protocol.reader_features
        and not delta_table.metadata().partition_columns
    )


def scan_files(delta_table: DeltaTable, paths: list[str], **scan_options) -> pl.LazyFrame:
    """The data files ``paths`` (relative to the table root) of an open table, in that order,
    with the table's schema (a file written before a column was added reads it as null) and
    the storage options the table was opened with."""
    root = delta_table.table_uri.rstrip("/")
    return pl.scan_parquet(
        [f"{root}/{path}" for path in paths],
        schema=pl.scan_delta(delta_table).collect_schema(),
        missing_columns="insert",
        extra_columns="ignore",
        storage_options=delta_table._storage_options,
        **scan_options,
    )


def ordered_files(
    delta_table: DeltaTable, column: str, within: pl.Series | None = None
) -> pl.DataFrame:
    """``path`` and ``num_records`` of the table's files in the order of their smallest
    ``column`` (files without statistics last); with ``within``, only the files whose range of
    ``column`` can hold one of its values (all of them when one is null). Delta keeps
    timestamps to the millisecond in file statistics, so a range is widened to whole ones."""
    files = pl.DataFrame(delta_table.get_add_actions(flatten=True))
    if files.is_empty() or f"min.{column}" not in files.columns:
        return pl.DataFrame(schema={"path": pl.String, "num_records": pl.Int64})
    low, high = pl.col(f"min.{column}"), pl.col(f"max.{column}")
    if within is not None and not within.is_empty() and not within.null_count():
        first, last = within.min(), within.max()
        if isinstance(first, datetime):
            first, last = floor_ms(first), last + timedelta(milliseconds=1)
        files = files.filter((low.is_null() | (low <= last)) & (high.is_null() | (high >= first)))
    return files.sort(low, "path", nulls_last=True).select("path", "num_records")


def scan_in_order(delta_table: DeltaTable, column: str) -> pl.LazyFrame:
    """The whole table, its files in the order of their smallest ``column`` (files without
    statistics last); ``pl.scan_delta``'s order when its files cannot be read directly."""
    files = ordered_files(delta_table, column) if plain_files(delta_table) else None
    if files is None or files.is_empty():
        return pl.scan_delta(delta_table)
    return scan_files(delta_table, files.get_column("path").to_list())
