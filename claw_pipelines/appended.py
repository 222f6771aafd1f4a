"""The rows a range of Delta commits appended, read by polars from the files they added.

A change-data-feed read (``DeltaTable.load_cdf``) of commits that only appended files returns
exactly the rows of the files those commits added, each with its commit's version. delta-rs
decodes them with its own Parquet reader, which takes ~1.4 times polars' CPU time on token
lists (100k turns of 1,280 tokens). So for such ranges (every landing table's usual case) the
commit files are read here for their ``add`` actions and the files scanned by polars; a range
holding anything else (a delete, an overwrite, change-data files, a file that is gone) is left
to the feed, which knows how those read (``lake.changes``).
"""

from __future__ import annotations

import json
from urllib.parse import unquote

import polars as pl
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler

from claw_pipelines.lake_store import is_remote


def _added_files(
    delta_table: DeltaTable, start: int, end: int, storage_options: dict[str, str] | None
) -> pl.DataFrame | None:
    """``path`` (relative) and ``version`` of the data files versions ``start..end`` added;
    None when one of them removed rows or wrote change-data files. Compaction's files
    (``dataChange`` false) hold rows added before: left out, as the feed leaves them out."""
    store = DeltaStorageHandler(delta_table.table_uri, storage_options)
    paths, versions = [], []
    for version in range(start, end + 1):
        with store.open_input_file(f"_delta_log/{version:020d}.json") as file:
            lines = file.read().splitlines()
        for action in (json.loads(line) for line in lines if line.strip()):
            removed = action.get("remove", {}).get("dataChange", False)
            if removed or "cdc" in action:
                return None
            add = action.get("add")
            if add is not None and add.get("dataChange", True):
                paths.append(unquote(add["path"]))
                versions.append(version)
    return pl.DataFrame(
        {"path": paths, "_commit_version": versions},
        schema={"path": pl.String, "_commit_version": pl.UInt64},
    )


def appended_rows(
    delta_table: DeltaTable, start: int, end: int, columns: list[str] | None
) -> pl.DataFrame | None:
    """The rows versions ``start..end`` of an open table appended, shaped like the change data
    feed's inserts (``_change_type``, ``_commit_version``); None when a commit of the range did
    more than append, when it added no file, or when a file it added is gone (vacuumed); and
    for a table on an object store opened without storage options.

    The files are read with the options the table was opened with (``Lake.open`` passes the
    lake's), so no caller has to pass them again. deltalake 1.6 keeps them only as
    ``DeltaTable._storage_options``, which its own ``write_deltalake`` and polars'
    ``scan_delta`` read the same way."""
    storage_options = delta_table._storage_options
    if storage_options is None and is_remote(delta_table.table_uri):
        return None
    try:
        added = _added_files(delta_table, start, end, storage_options)
        if added is None or added.is_empty():
            return None
        root = delta_table.table_uri.rstrip("/")
        files = [f"{root}/{path}" for path in added.get_column("path")]
        schema = pl.scan_delta(delta_table).collect_schema()
        frame = pl.scan_parquet(
            files,
            schema=schema,
            missing_columns="insert",
            extra_columns="ignore",
            include_file_paths="_file",
            storage_options=storage_options,
        )
        # each row's version looked up by its file: a join would gather every column (the
        # token lists) into the joined order, ~0.15 CPU s per 20k turns of 1,280 tokens
        version = pl.col("_file").replace_strict(
            files, added.get_column("_commit_version"), return_dtype=pl.UInt64
        )
        return frame.select(
            *(columns or schema.names()),
            pl.lit("insert").alias("_change_type"),
            version.alias("_commit_version"),
        ).collect()
    except (OSError, pl.exceptions.ComputeError):
        return None
