"""Lake maintenance: compaction of the landing tables, which the proxies append to.

A proxy commits every second or so under load, so a landing table gains thousands of small files
a day, and every open, checkpoint and scan of it slows down as it ages. The derived tables
compact themselves after their commits; the landing tables are compacted here, by a scheduled
job, so no proxy spends request-serving time on it. Compaction commits no data change: the
change-data-feed readers skip it, and it is compatible with appends running at the same time.
"""

import dagster as dg

from assets.incremental import COMPACT_AFTER_FILES, WRITER
from assets.landing import LANDING_TABLES
from claw_pipelines.lake import compact
from resources.lake import LakeResource

COMPACTION_CRON = "*/10 * * * *"


@dg.op(description="Compact each landing table that holds more than COMPACT_AFTER_FILES files.")
def compact_landing_tables(context: dg.OpExecutionContext, lake: LakeResource) -> None:
    the_lake = lake.lake()
    for name in LANDING_TABLES:
        table = the_lake.open(name)
        if table is None:
            continue
        before = len(table.file_uris())
        compact(table, max_files=COMPACT_AFTER_FILES, writer_properties=WRITER)
        after = len(table.file_uris())
        context.log.info("%s: %d files, %d after compaction", name, before, after)


@dg.job(description="Compacts the landing tables' small files (no data change).")
def landing_compaction():
    compact_landing_tables()


landing_compaction_schedule = dg.ScheduleDefinition(
    job=landing_compaction,
    cron_schedule=COMPACTION_CRON,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
