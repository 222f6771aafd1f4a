"""The one path by which rows are committed to the lake's tables, or deleted from them.

Every write of rows to a table is a ``commit`` here, and every delete a ``delete`` (no other
module calls ``write_deltalake`` or a table's ``delete``: ``tests/test_layers.py``): its mode
(append, overwrite, or replace the rows a predicate matches), schema merge, writer properties,
commit properties (retries, app transactions, metadata), the tiered compaction that follows
once more than ``COMPACT_AFTER_FILES`` small files wait, and what a commit refused by another
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
    """Merge the table's small files, tier by tier, up to ``target_size`` (delta-rs's default:
    the table's ``delta.targetFileSize``, else 100 MB), once more than ``max_files`` wait at a
    tier (``due_merge_size``; the handle moves to the new version). A table that gets a small
    commit per run would otherwise make every open and scan slower as it ages. The commit
    carries no data change, so change-data-feed readers skip it, and earlier versions stay
    readable until a ``vacuum`` deletes the merged files (only the landing tables' are, after a
    retention: ``assets.maintenance``). It only saves work later: when another writer removed
    files it merged (its commit is rejected), it is skipped, and the caller's own commit,
    already made, stands; a later compaction merges them."""
    if target_size is None:
        configured = delta_table.metadata().configuration.get("delta.targetFileSize")
        target_size = int(configured or DEFAULT_TARGET_FILE_BYTES)
    file_bytes = pl.DataFrame(delta_table.get_add_actions()).get_column("size_bytes")
    size = due_merge_size(file_bytes, target_size, max_files)
    if size is not None:
        with contextlib.suppress(CommitFailedError):
            delta_table.optimize.compact(target_size=size, writer_properties=writer_properties)


MERGE_FANOUT = 16
"""Each merge size is this many times the one below it (``merge_sizes``)."""

SMALLEST_MERGE_BYTES = 256 << 10
"""No merge size is below this: merging a few hundred KB costs little whatever the tier."""


def merge_sizes(target_size: int) -> list[int]:
    """The sizes a table's files are merged up to, smallest first: ``target_size`` and each
    ``MERGE_FANOUT``th of the one above, down to ``SMALLEST_MERGE_BYTES`` (32 MB: 2 and 32 MB).

    One size alone made every compaction rewrite the file the previous one merged, with the new
    small files, until it reached the size: a cost that grew with the table's age (a landing
    table's merged file of 9 MB after 30 minutes of a soak, rewritten every minute and a half,
    for 100 minutes; a derived table's for a day). delta-rs merges runs of adjacent files up to
    the size it is given, so merging to the smallest size rewrites at most that size beside the
    new files, and a larger size is due only once many files of the size below wait: each
    row is rewritten about once per size."""
    sizes = [target_size]
    while sizes[0] // MERGE_FANOUT >= SMALLEST_MERGE_BYTES:
        sizes.insert(0, sizes[0] // MERGE_FANOUT)
    return sizes


def due_merge_size(file_bytes: pl.Series, target_size: int, max_files: int) -> int | None:
    """The largest of ``merge_sizes`` with more than ``max_files`` files waiting for it: files
    from half the size below it (what merging to that one made) up to half its own (what
    merging to it makes, or a commit wrote that large, is not waiting). None when none is due."""
    sizes = merge_sizes(target_size)
    floors = [0, *(size // 2 for size in sizes[:-1])]
    for floor, size in reversed(list(zip(floors, sizes, strict=True))):
        if file_bytes.is_between(floor, size // 2, closed="left").sum() > max_files:
            return size
    return None


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
