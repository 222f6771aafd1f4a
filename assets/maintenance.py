"""Lake maintenance: compaction and vacuum of the landing tables, which the proxies append to.

A proxy commits every second or so under load, so a landing table gains thousands of small files
a day, and every open, checkpoint and scan of it slows down as it ages. The derived tables
compact themselves after their commits; the landing tables are compacted here, by a scheduled
job, so no proxy spends request-serving time on it. Compaction commits no data change: the
change-data-feed readers skip it, and it is compatible with appends running at the same time.

Compaction leaves the small files it merged on disk (older versions still refer to them), so a
busy lake would hold its data twice over and more. The job then vacuums them once they were
merged longer than the retention ago. Each derived asset reads the landing tables by Delta
version, from the change data feed after its watermark (``incremental.increment``), and the feed
reads the small files those versions added, not the merged ones. So the job stretches the
retention to keep every file merged since the first version its slowest reader has yet to read
(``LANDING_READERS``): a pipeline that lagged (Dagster stopped, an asset failing for days)
catches up. A vacuum done outside this job that deletes them makes that reader fail with
``lake.VersionsVacuumed`` (the rows are still in the table, but no longer by version). A read
from the start (a new derived table, the inspector starting up) takes the table's snapshot
instead. delta-rs refuses a retention shorter than the table's
``delta.deletedFileRetentionDuration`` (7 days unless set) unless enforcement is turned off.
"""

import math
from datetime import UTC, datetime

import dagster as dg
from deltalake import DeltaTable
from pydantic import Field

from assets.landing import LANDING_READERS, LANDING_TABLES
from claw_pipelines.incremental.increment import COMPACT_AFTER_FILES, WRITER
from claw_pipelines.lake import Lake, compact, data_commits, watermark_app
from claw_pipelines.schemas import utc_now
from resources.lake import LakeResource

MAINTENANCE_CRON = "*/10 * * * *"


class LandingMaintenanceConfig(dg.Config):
    """How long merged files stay on disk (editable in the launchpad)."""

    vacuum_retention_hours: int = Field(
        default=168,
        ge=0,
        description="Vacuum files merged away longer ago than this; readers may lag this much.",
    )
    enforce_retention_duration: bool = Field(
        default=True,
        description="Refuse a retention shorter than delta.deletedFileRetentionDuration.",
    )


def first_unread_commit(lake: Lake, name: str, table: DeltaTable) -> datetime | None:
    """When the first rows of landing table ``name`` that one of its readers has yet to read were
    committed (None when all are up to date). A reader that never read it reads its snapshot
    from the start, which a vacuum cannot break, so it does not count."""
    read = [
        version
        for reader in LANDING_READERS[name]
        if (version := lake.committed_app_version(reader, watermark_app(reader, name))) is not None
    ]
    unread = data_commits(table, min(read)) if read else []
    if not unread:
        return None
    return datetime.fromtimestamp(min(c["timestamp"] for c in unread) / 1000, UTC)


def retention_hours(configured: int, unread_since: datetime | None, now: datetime) -> int:
    """The configured retention, stretched (plus an hour for clock skew between writers) to keep
    every file merged away since ``unread_since``: a file a reader still needs was added after
    the last version it read, so it was merged, and its removal stamped, after that version's
    commit. The job thus never deletes what a reader lagging behind has yet to read."""
    if unread_since is None:
        return configured
    return max(configured, math.ceil((now - unread_since).total_seconds() / 3600) + 1)


@dg.op(
    description="Compact each landing table holding more than COMPACT_AFTER_FILES files, then "
    "vacuum the files merged away longer than the retention ago."
)
def maintain_landing_tables(
    context: dg.OpExecutionContext, config: LandingMaintenanceConfig, lake: LakeResource
) -> None:
    the_lake = lake.lake()
    for name in LANDING_TABLES:
        table = the_lake.open(name)
        if table is None:
            continue
        before = len(table.file_uris())
        compact(table, max_files=COMPACT_AFTER_FILES, writer_properties=WRITER)
        unread_since = first_unread_commit(the_lake, name, table)
        retention = retention_hours(config.vacuum_retention_hours, unread_since, utc_now())
        if retention > config.vacuum_retention_hours:
            context.log.info(
                "%s: a reader has yet to read versions committed since %s: vacuum keeps %d h",
                name,
                unread_since,
                retention,
            )
        deleted = the_lake.vacuum(
            name, retention, enforce_retention_duration=config.enforce_retention_duration
        )
        context.log.info(
            "%s: %d files, %d after compaction, %d merged files vacuumed",
            name,
            before,
            len(table.file_uris()),
            len(deleted),
        )


@dg.job(description="Compacts the landing tables' small files and vacuums the merged ones.")
def landing_maintenance():
    maintain_landing_tables()


landing_maintenance_schedule = dg.ScheduleDefinition(
    job=landing_maintenance,
    cron_schedule=MAINTENANCE_CRON,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
