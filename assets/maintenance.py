"""Lake maintenance: compaction and vacuum of the landing tables, which the proxies append to.

A proxy commits every second or so under load, so a landing table gains thousands of small files
a day, and every open, checkpoint and scan of it slows down as it ages. The derived tables
compact themselves after their commits; the landing tables are compacted here, by a scheduled
job, so no proxy spends request-serving time on it. Compaction commits no data change: the
change-data-feed readers skip it, and it is compatible with appends running at the same time.

Compaction leaves the small files it merged on disk (older versions still refer to them), so a
busy lake would hold its data twice over and more. The job then vacuums them once they were
merged longer than the retention ago. That retention bounds how far behind a reader of the
landing tables may fall: each derived asset reads them by Delta version, from the change data
feed after its watermark (``assets.incremental``), and the feed reads the small files those
versions added, not the merged ones. A reader further behind than the retention (Dagster
stopped for longer, an asset failing for days) finds the files of the versions it has yet to
read deleted: its runs fail with ``lake.VersionsVacuumed`` (the rows are still in the table,
but no longer by version). A read from the start (a new derived table, the inspector starting
up) takes the table's snapshot instead. Delta's
7 days leave a week to catch up; delta-rs refuses a retention shorter than the table's
``delta.deletedFileRetentionDuration`` (7 days unless set) unless enforcement is turned off.
"""

import dagster as dg
from pydantic import Field

from assets.incremental import COMPACT_AFTER_FILES, WRITER
from assets.landing import LANDING_TABLES
from claw_pipelines.lake import compact
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
        deleted = the_lake.vacuum(
            name,
            config.vacuum_retention_hours,
            enforce_retention_duration=config.enforce_retention_duration,
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
