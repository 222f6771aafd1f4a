"""Landing-table maintenance as a Dagster schedule: the pass the proxies run themselves
(``claw_pipelines.maintenance``: compaction, checkpoint, log cleanup and vacuum, keeping what a
lagging reader has yet to read), shown in the UI with its runs and logs.

It takes the same lease in the lake as the proxies, so a pass never runs beside theirs: while a
proxy holds it, the run logs who does and does nothing. It releases the lease when done, as the
schedule spaces its passes.
"""

import dagster as dg
from pydantic import Field

from claw_pipelines.lake.commits import COMPACT_AFTER_FILES
from claw_pipelines.lease import Lease
from claw_pipelines.maintenance import MIN_LOG_RETENTION_MINUTES, Retention, maintain_lake
from claw_pipelines.settings import get_settings
from resources.lake import LakeResource

MAINTENANCE_CRON = "*/10 * * * *"
LEASE_S = 600.0
"""How long a run holds the lease at a time (renewed before each table)."""


class LandingMaintenanceConfig(dg.Config):
    """How long what the pass removes stays (editable in the launchpad); unset: the
    ``CLAW_*`` settings the proxies use."""

    vacuum_retention_hours: int | None = Field(
        default=None,
        ge=0,
        description="Vacuum files merged away longer ago than this; readers may lag this much "
        "(default CLAW_VACUUM_RETENTION_HOURS).",
    )
    enforce_retention_duration: bool | None = Field(
        default=None,
        description="Refuse a retention shorter than delta.deletedFileRetentionDuration "
        "(default CLAW_VACUUM_ENFORCE_RETENTION).",
    )
    log_retention_minutes: int | None = Field(
        default=None,
        ge=MIN_LOG_RETENTION_MINUTES,
        description="Delete log entries and checkpoints older than this, unless a reader has "
        "yet to read them (default CLAW_LOG_RETENTION_MINUTES).",
    )

    def retention(self) -> Retention:
        chosen = {
            "vacuum_retention_hours": self.vacuum_retention_hours,
            "enforce_retention_duration": self.enforce_retention_duration,
            "log_retention_minutes": self.log_retention_minutes,
        }
        defaults = Retention.from_settings(get_settings())
        return defaults.model_copy(
            update={k: v for k, v in chosen.items() if v is not None}
            | {"compact_after_files": COMPACT_AFTER_FILES}
        )


@dg.op(
    description="Compact each landing table holding more than COMPACT_AFTER_FILES files, write "
    "a checkpoint, delete the expired log and the superseded checkpoints and vacuum the files "
    "merged away longer than the retention ago, under the lake's maintenance lease."
)
def maintain_landing_tables(
    context: dg.OpExecutionContext, config: LandingMaintenanceConfig, lake: LakeResource
) -> None:
    the_lake = lake.lake()
    lease = Lease(the_lake, f"dagster-{context.run_id}", LEASE_S)
    try:
        passes = maintain_lake(the_lake, config.retention(), lease)
    finally:
        lease.release()
    if passes is None:
        holding = lease.holding()
        context.log.info("%s holds the maintenance lease until %s", holding.holder,
                         holding.expires_at)  # fmt: skip
        return
    for done in passes:
        context.log.info(
            "%s: %d files, %d after compaction, %d merged files vacuumed; log %s%s",
            done.table,
            done.files_before,
            done.files_after,
            done.vacuumed,
            "cleaned up" if done.log_cleaned else "kept",
            "" if done.unread_since is None else f" (a reader has yet to read {done.unread_since})",
        )


@dg.job(description="The landing tables' maintenance pass (the proxies run it too).")
def landing_maintenance():
    maintain_landing_tables()


landing_maintenance_schedule = dg.ScheduleDefinition(
    job=landing_maintenance,
    cron_schedule=MAINTENANCE_CRON,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
