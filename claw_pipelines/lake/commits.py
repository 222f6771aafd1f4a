"""The one path by which rows are committed to the lake's tables, or deleted from them.

Every write of rows to a table is a ``commit`` here, and every delete a ``delete`` (no other
module calls ``write_deltalake`` or a table's ``delete``: ``tests/test_layers.py``): its mode
(append, overwrite, or replace the rows a predicate matches), schema merge, writer properties,
commit properties (retries, app transactions, metadata), the compaction that follows once a
table holds more than ``COMPACT_AFTER_FILES`` files, and what a commit refused by another
writer's means to its caller (``ConcurrentRun``, or ``CommitFailedError`` for a caller that
decides itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Literal

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError

from claw_pipelines.lake.properties import TABLE_CONFIGURATION

COMPACT_AFTER_FILES = 64
"""Every run adds a small file to each derived table (and to ``steps_tails``); past this many
they are merged."""

DEFAULT_TARGET_FILE_BYTES = 100 << 20
"""What delta-rs's compaction merges files up to when a table sets no ``delta.targetFileSize``."""


class ConcurrentRun(RuntimeError):
    """Another run committed to the table this run was about to commit to (its output, a
    batch's ledger or rows) since this run's snapshot. That commit stands; this run's rows and
    state never count. A retry reads on from the committed watermark (``assets.races`` makes
    Dagster retry the step)."""


def commit_properties(
    max_commit_retries: int,
    apps: Mapping[str, int] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> CommitProperties:
    """A commit's properties: ``max_commit_retries``, an app transaction per ``apps`` entry (app
    id: version; what ``DeltaTable.transaction_version`` reads back), and ``metadata`` in the
    commit info."""
    transactions = [Transaction(app_id=app, version=v) for app, v in (apps or {}).items()]
    return CommitProperties(
        max_commit_retries=max_commit_retries,
        app_transactions=transactions or None,
        custom_metadata=None if metadata is None else dict(metadata),
    )


def delete(
    target: DeltaTable, predicate: str | None, properties: CommitProperties | None = None
) -> None:
    """Delete the rows ``predicate`` matches (every row when None) in one commit, with
    ``properties`` (say the app transaction that records how far the caller got); a commit
    refused by another writer's raises ``CommitFailedError`` for the caller to decide."""
    target.delete(predicate, commit_properties=properties)


def commit(
    target: DeltaTable,
    data: pa.Table | pa.RecordBatchReader,
    *,
    mode: Literal["append", "overwrite"] = "append",
    predicate: str | None = None,
    schema_mode: Literal["merge", "overwrite"] | None = None,
    properties: CommitProperties | None = None,
    writer_properties: WriterProperties | None = None,
    compact_after: int | None = None,
    target_size: int | None = None,
    refused: str | None = None,
) -> int:
    """Write ``data`` to ``target`` in one commit (the handle moves to it) and return the
    version made. ``mode="overwrite"`` with a ``predicate`` replaces the rows it matches, without
    one the whole table. From ``target``'s snapshot: a commit of another writer since then that
    conflicts (same app transaction, files removed) refuses it after ``properties``' retries;
    with ``refused`` the refusal is raised as ``ConcurrentRun(refused)``, else as delta-rs's
    ``CommitFailedError``. With ``compact_after`` the table's files under ``target_size`` are
    then merged once more than that many, with the same writer properties (``compact``)."""
    try:
        write_deltalake(
            target,
            data,
            mode=mode,
            predicate=predicate,
            schema_mode=schema_mode,
            commit_properties=properties,
            writer_properties=writer_properties,
        )
    except CommitFailedError as error:
        if refused is None:
            raise
        raise ConcurrentRun(refused) from error
    version = target.version()
    if compact_after is not None:
        compact(
            target,
            max_files=compact_after,
            writer_properties=writer_properties,
            target_size=target_size,
        )
    return version


def compact(
    delta_table: DeltaTable,
    *,
    max_files: int,
    writer_properties: WriterProperties | None = None,
    target_size: int | None = None,
) -> None:
    """Merge the table's files no larger than ``target_size`` (delta-rs's default: the table's
    ``delta.targetFileSize``, else 100 MB) once more than ``max_files`` are (the handle moves to
    the new version). A table that gets a small commit per run would otherwise make every open
    and scan slower as it ages. Larger files are neither merged nor counted: a table of many
    of them would otherwise be compacted after every commit. The commit carries no data
    change, so change-data-feed readers skip it, and earlier versions stay readable until a
    ``vacuum`` deletes the merged files (only the landing tables' are, after a retention:
    ``assets.maintenance``). It only saves work later: when another writer removed files it
    merged (its commit is rejected), it is skipped, and the caller's own commit, already made,
    stands; a later compaction merges them."""
    if _mergeable(delta_table, target_size) > max_files:
        with contextlib.suppress(CommitFailedError):
            delta_table.optimize.compact(
                target_size=target_size, writer_properties=writer_properties
            )


def _mergeable(delta_table: DeltaTable, target_size: int | None) -> int:
    """How many of the table's files a compaction to ``target_size`` would merge."""
    if target_size is None:
        configured = delta_table.metadata().configuration.get("delta.targetFileSize")
        target_size = int(configured or DEFAULT_TARGET_FILE_BYTES)
    sizes = pl.DataFrame(delta_table.get_add_actions()).get_column("size_bytes")
    return int((sizes <= target_size).sum())


def keep_configured(
    delta_table: DeltaTable,
    properties: CommitProperties,
    wanted: Mapping[str, str] = TABLE_CONFIGURATION,
) -> None:
    """Set the ``wanted`` table properties (a derived table's by default) ``delta_table`` lacks
    or holds otherwise, committed with ``properties``: one commit the first time, nothing after
    (its metadata is in memory). Refused because another process committed meanwhile, it is
    left for the next call."""
    configured = delta_table.metadata().configuration
    if any(configured.get(key) != value for key, value in wanted.items()):
        with contextlib.suppress(CommitFailedError):
            delta_table.alter.set_table_properties(dict(wanted), commit_properties=properties)


def drop_removed_files(delta_table: DeltaTable, keep_versions: list[int] | None = None) -> None:
    """Delete the files no version from the handle's on needs, nor ``keep_versions`` (a vacuum
    with no retention). Only for the steps run's state tables, through the handle that wrote
    them: they are rewritten often, and their old files would otherwise pile up."""
    delta_table.vacuum(
        retention_hours=0,
        enforce_retention_duration=False,
        dry_run=False,
        keep_versions=keep_versions,
    )


def watermark_app(asset: str, source: str) -> str:
    """The app transaction that an incremental asset's output commits carry for one input (or
    for its run number and attempt): the input's Delta version it read up to."""
    return f"claw/{asset}/{source}"
