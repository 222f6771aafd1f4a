"""What a table's commits added: the rows of a range of versions (``changes``), and which
commits changed rows at all (``data_commits``).

A change-data-feed read (``DeltaTable.load_cdf``) of commits that only appended files returns
exactly the rows of the files those commits added, each with its commit's version. delta-rs
decodes them with its own Parquet reader, which takes ~1.4 times polars' CPU time on token
lists (100k turns of 1,280 tokens). So for such ranges (every landing table's usual case) the
commit files are read here for their ``add`` actions and the files scanned by polars; a range
holding anything else (a delete, an overwrite, change-data files, a file that is gone) is left
to the feed, which knows how those read.
"""

from __future__ import annotations

import json
from urllib.parse import unquote

import polars as pl
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler

from claw_pipelines.lake.store import is_remote


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


class VersionsVacuumed(RuntimeError):
    """A change-data-feed read of versions whose files were compacted and then vacuumed."""


def changes(
    delta_table: DeltaTable,
    after_version: int | None,
    up_to_version: int,
    columns: list[str] | None = None,
    *,
    with_version: bool = False,
) -> pl.DataFrame | None:
    """Rows inserted into an open table in versions ``(after_version, up_to_version]``, read
    from its change data feed (None when the range is empty): the ``columns`` asked for (default
    all), and with ``with_version`` the ``_commit_version`` each row landed in. Commits that
    only appended are read by polars from the files they added (``appended_rows``,
    with the storage options the table was opened with). Every reader of what is new goes
    through here (an ``Increment`` for its run's range).

    The feed reads the log entries of those versions and the files they added. Once the
    entries were cleaned up, or compaction merged the files and a vacuum deleted them (the
    landing tables, ``claw_pipelines.maintenance``), a read from the start of an append-only
    table takes its rows from the snapshot instead (all it ever inserted), each with
    ``up_to_version`` as ``_commit_version`` (committed at or before it); a read from a later
    version raises ``VersionsVacuumed``, as those rows can no longer be told apart (maintenance
    keeps what a reader it knows of has yet to read, so only an outside cleanup gets there).
    A reader whose own version's entry is gone reads on from the entries after it.
    """
    if after_version is not None and up_to_version <= after_version:
        return None
    start = 0 if after_version is None else after_version + 1
    try:
        inserted = appended_rows(delta_table, start, up_to_version, columns)
        if inserted is None:
            inserted = _inserted(delta_table, start, up_to_version, columns)
    except Exception as error:  # delta-rs tells these apart only by a bare Exception's text
        if not any(sign in str(error) for sign in GONE):
            raise
        if after_version is not None or up_to_version != delta_table.version():
            raise VersionsVacuumed(
                f"{delta_table.table_uri}: versions {start} to {up_to_version} can no longer be "
                "read from the change data feed: the files they added were compacted and then "
                "vacuumed, or their log entries cleaned up, as this reader fell further behind "
                "than the vacuum retention or the log retention (claw_pipelines.maintenance)"
            ) from error
        inserted = (
            pl.scan_delta(delta_table)
            .select(columns or pl.all())
            .with_columns(pl.lit(up_to_version, pl.UInt64).alias("_commit_version"))
            .collect()
        )
    kept = ["_commit_version"] if with_version else []
    return inserted.drop(sorted(set(CHANGE_COLUMNS) - set(kept)), strict=False)


GONE = ("not found", "Invalid table version")
"""How delta-rs says a version range cannot be read: a file it added is gone (vacuumed), or a
log entry is (cleaned up: ``Invalid table version``)."""

CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
"""The columns a change-data-feed read adds to a table's own."""


def _inserted(
    delta_table: DeltaTable, start: int, up_to_version: int, columns: list[str] | None
) -> pl.DataFrame:
    wanted = None if columns is None else [*columns, "_change_type", "_commit_version"]
    reader = delta_table.load_cdf(
        starting_version=start,
        ending_version=up_to_version,
        columns=wanted,
        predicate="_change_type = 'insert'",
    )
    return pl.DataFrame(reader.read_all())


NO_DATA_CHANGE = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES"})
"""Operations whose commits change no rows: compaction, the two commits of a vacuum, and
maintenance setting a table's retention properties."""


def data_commits(delta_table: DeltaTable, after_version: int) -> list[dict]:
    """The commits after ``after_version`` that changed rows (newest first), from the history
    of those versions only: compactions and vacuums are left out."""
    newer = delta_table.version() - after_version
    if newer <= 0:
        return []
    commits = delta_table.history(limit=newer)
    return [c for c in commits if c.get("operation") not in NO_DATA_CHANGE]
