"""What the lake's tables are created and written with: their Delta table properties and the
Parquet writer properties of their files."""

from __future__ import annotations

from deltalake import ColumnProperties, WriterProperties

from claw_pipelines.schemas import LANDING_MODELS

TABLE_CONFIGURATION = {
    "delta.enableChangeDataFeed": "true",
    "delta.checkpointInterval": "10",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}
"""Landing and derived tables keep a change data feed so readers can take only what is new, and
a checkpoint every 10 commits: opening a table replays at most 9 JSON commits (~6 ms instead of
~15 ms at 25 commits), and a pipeline run opens tables a few dozen times. A checkpoint lists the
files removed within ``delta.deletedFileRetentionDuration``: Delta's 7 days made it list every
file a derived table's runs replaced or compacted that week (a few a run, ~85 bytes each, read
by every open); the only vacuums of derived tables (``drop_removed_files``) run right after the
removal. Tables made before are set so by their next run (``keep_configured``)."""

LANDING_CHECKPOINT_INTERVAL = 25
"""The landing tables take a commit per writer and commit window (a second or so), and a
checkpoint lists every live file: until maintenance compacts them (``claw_pipelines.maintenance``)
their files grow with the commits, so a checkpoint every 10 commits made the log grow with the
square of the commits between compactions. Every 25 an open replays at most 24 small JSON commits
and the checkpoints written between two compactions weigh a fifth as much."""

FILTERED_COLUMNS = frozenset(
    {"trajectory_id", "group_id", "target_id", "started_at", "ended_at", "created_at", "version"}
)
"""The landing columns readers filter on (besides each table's key): the only ones whose
statistics a landing table keeps, in each file's Parquet chunks and in the Delta log. Statistics
of every column (messages, API bodies, metadata) made ~2.9 KB per file in each checkpoint."""


def stats_columns(table: str) -> list[str]:
    """The columns of landing ``table`` that get statistics: its key and ``FILTERED_COLUMNS``."""
    model = LANDING_MODELS[table]
    return [
        f.name for f in model.arrow_schema() if f.name == model.key or f.name in FILTERED_COLUMNS
    ]


def table_configuration(table: str) -> dict[str, str]:
    """The properties ``table`` is created with: a landing table's checkpoint cadence and
    statistics columns (``delta.dataSkippingStatsColumns``) are its own, and its expired log is
    deleted by maintenance only, which keeps what a lagging reader needs (delta-rs would
    otherwise delete it after each checkpoint a commit writes)."""
    if table not in LANDING_MODELS:
        return TABLE_CONFIGURATION
    return TABLE_CONFIGURATION | {
        "delta.checkpointInterval": str(LANDING_CHECKPOINT_INTERVAL),
        "delta.dataSkippingStatsColumns": ",".join(stats_columns(table)),
        "delta.enableExpiredLogCleanup": "false",
    }


LANDING_ROW_GROUP_ROWS = 1024
"""Rows per row group of a landing file. Readers of a time window (a release completing its
batch's turns, by ``started_at``) skip the row groups outside it by their statistics: a merged
file written as one row group (delta-rs's default holds a million rows) was decoded whole by
every release, so a release slowed as the table aged. A turn row can hold a whole prompt (a
few hundred KB), hence fewer rows than the derived tables' groups."""

LANDING_FILE_BYTES = 32 << 20
"""The size compaction merges the landing files up to, through 2 MB files first
(``commits.merge_sizes``; delta-rs's ``target_size`` is 100 MB by default): a read of a time
window skips files, as it skips row groups, by their statistics."""


SETTLED_FILE_BYTES = 1 << 20
"""Compaction merges the files of a recipe's ledger and retirements smaller than this. Their
rows land about in the order their trajectories started, so a merged file spans a short
stretch of ``trajectory_started_at`` and a plan skips it by its statistics once the stretch is
behind the plan's window (``planner.started_since``). Merged up to delta-rs's 100 MB, the
table was one file that every plan read whole and every compaction rewrote whole. At 25-45
bytes a ledger row, a full file holds 25-40k rows (a quarter to half an hour of a soak's
batches): what a plan reads beyond its window is about one such file and the small ones
since."""


def landing_writer(table: str) -> WriterProperties:
    """How a landing table's files are written (by the proxies and by compaction): chunk
    statistics for ``stats_columns`` only and no dictionaries, like the derived tables'
    (``derived_schemas.WRITER``): min/max over token lists and dictionaries of unique ids
    cost write time and no reader uses them; row groups of ``LANDING_ROW_GROUP_ROWS``."""
    return statistics_only(stats_columns(table), max_row_group_size=LANDING_ROW_GROUP_ROWS)


COMPRESSION = "ZSTD"
COMPRESSION_LEVEL = 1
"""How the files of the landing and derived tables are compressed. Writer properties that name
no codec make delta-rs write uncompressed Parquet (its own default, snappy, applies only when no
properties are given), and writing the bytes is what costs: in commits of 64 rows of a
48k-token call, a row took 1.62 ms of CPU uncompressed, 1.25 of them in the kernel, against
0.87 ms with snappy and 0.38 with zstd level 1 (the embedded engine's IDs); with random IDs of
a 150k vocabulary 1.28 ms either way, the file 135 KB a row instead of 259 KB."""


def statistics_only(columns: list[str], max_row_group_size: int | None = None) -> WriterProperties:
    """Files with chunk statistics for ``columns`` only, no dictionary encoding, compressed
    (``COMPRESSION``): token-ID lists are most of the bytes, and for them the writer's defaults
    (dictionaries, page statistics) cost ~4x the write time; the statistics of the filtered
    columns keep file and row-group skipping. (delta-rs keys column properties by top-level
    name only.)"""
    return WriterProperties(
        max_row_group_size=max_row_group_size,
        compression=COMPRESSION,
        compression_level=COMPRESSION_LEVEL,
        default_column_properties=ColumnProperties(
            dictionary_enabled=False, statistics_enabled="NONE"
        ),
        column_properties=dict.fromkeys(
            columns, ColumnProperties(dictionary_enabled=False, statistics_enabled="CHUNK")
        ),
    )
