"""Dagster's own history kept for a retention, as the lake's log is: finished runs with their
events and captured logs, the landing tables' runless materializations and the automation
sensor's evaluations.

Under steady traffic a refresh run starts every few seconds, and each leaves about half a MB in
the instance's storage: its event log (an SQLite file of its own, over 100 KB however few its
events), its asset events and check executions mirrored in the index, its captured stdout and
stderr, the ingest sensor's materializations of the landing tables and the automation sensor's
evaluations (about 40 KB per asset per tick, which Dagster keeps 30 days). A 30-minute soak left
184 MB, about 9 GB a day, kept for ever. The ``dagster_history`` schedule deletes every hour what
is older than ``CLAW_RUN_HISTORY_HOURS`` (``prune_history``):

- successful runs, except those holding an asset's latest materialization, which the UI shows
  and declarative automation reads (failed and canceled runs stay, to be looked at);
- the landing tables' runless materializations, except each table's latest;
- the automation sensor's evaluations.

Dagster purges the sensors' ticks itself after a day (``retention`` in the shipped
dagster.yaml). SQLite reuses the pages freed, so the databases stop growing rather than shrink.
"""

import contextlib
import itertools
import os
from datetime import UTC, datetime, timedelta

import dagster as dg
import sqlalchemy as db
from dagster._core.storage.event_log.schema import (
    AssetCheckExecutionsTable,
    AssetEventTagsTable,
    SqlEventLogStorageTable,
)
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from pydantic import BaseModel, Field

from claw_pipelines.settings import get_settings

HISTORY_CRON = "17 * * * *"

RUNS_PER_PASS = 5000
"""At most this many runs are deleted per pass (a soak starts ~700 an hour), so an instance
with weeks of history catches up over a few passes instead of one long one."""

DELETE_CHUNK = 500
"""Rows named per ``IN`` list (SQLite caps a statement's variables)."""

RUNLESS_EVENTS = (
    dg.DagsterEventType.ASSET_MATERIALIZATION.value,
    dg.DagsterEventType.ASSET_OBSERVATION.value,
)


class HistoryPruned(BaseModel):
    """What one pass deleted."""

    runs: int
    runs_kept_for_assets: int
    runless_events: int
    evaluations_before: datetime


def asset_runs(instance: dg.DagsterInstance) -> set[str]:
    """The runs that hold an asset's latest materialization."""
    return {
        latest.run_id
        for record in instance.get_asset_records()
        if (latest := record.asset_entry.last_materialization_record) is not None
    }


def _chunks(ids: list, size: int = DELETE_CHUNK):
    iterator = iter(ids)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def delete_runs(instance: dg.DagsterInstance, run_ids: list[str]) -> None:
    """Delete the runs with their events, check executions and captured logs
    (``DagsterInstance.delete_run`` leaves the last two), each run's record last: a pass killed
    midway leaves runs the next pass finds and deletes again, never events of a run no pass
    can find. An SQLite instance's per-run event files are deleted whole and their rows in the
    index in one transaction: deleting each run's rows from its own file first cost 30 ms a
    run, against 5."""
    events = instance.event_log_storage
    if isinstance(events, SqliteEventLogStorage):
        with events.index_connection() as conn:
            for run_id in run_ids:
                events.delete_events_for_run(conn, run_id)
        for run_id in run_ids:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(events.path_for_shard(run_id))
    else:
        for run_id in run_ids:
            events.delete_events(run_id)
    if isinstance(events, SqlEventLogStorage):
        with events.index_connection() as conn:
            for chunk in _chunks(run_ids):
                conn.execute(
                    AssetCheckExecutionsTable.delete().where(
                        AssetCheckExecutionsTable.c.run_id.in_(chunk)
                    )
                )
    for run_id in run_ids:
        instance.compute_log_manager.delete_logs(prefix=[run_id])
        instance.run_storage.delete_run(run_id)


def _delete_runless(conn, before: datetime) -> int:
    """Delete the runless asset events before ``before`` on one connection, but each asset's
    latest; how many."""
    events = SqlEventLogStorageTable
    runless = db.and_(events.c.run_id == "", events.c.dagster_event_type.in_(RUNLESS_EVENTS))
    latest = db.select(db.func.max(events.c.id)).where(runless).group_by(events.c.asset_key)
    old = conn.execute(
        db.select(events.c.id).where(
            runless, events.c.timestamp < before, events.c.id.not_in(latest.scalar_subquery())
        )
    )
    ids = [row[0] for row in old]
    for chunk in _chunks(ids):
        conn.execute(AssetEventTagsTable.delete().where(AssetEventTagsTable.c.event_id.in_(chunk)))
        conn.execute(events.delete().where(events.c.id.in_(chunk)))
    return len(ids)


def delete_runless_events(instance: dg.DagsterInstance, before: datetime) -> int:
    """Delete the runless materializations and observations (the ingest sensor's, of the
    landing tables) older than ``before``, but each asset's latest; how many. An SQLite
    instance keeps them in the file of run id "" and mirrors them in its index."""
    events = instance.event_log_storage
    if not isinstance(events, SqlEventLogStorage):
        return 0
    naive = before.astimezone(UTC).replace(tzinfo=None)  # the tables store naive UTC
    with events.index_connection() as conn:
        deleted = _delete_runless(conn, naive)
    if isinstance(events, SqliteEventLogStorage):
        with events.run_connection("") as conn:
            _delete_runless(conn, naive)
    return deleted


def prune_history(
    instance: dg.DagsterInstance, before: datetime, max_runs: int = RUNS_PER_PASS
) -> HistoryPruned:
    """Delete what the module says from before ``before``: up to ``max_runs`` runs, oldest
    first."""
    kept = asset_runs(instance)
    finished = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS], updated_before=before),
        limit=max_runs + len(kept),
        ascending=True,
    )
    old = [record.dagster_run.run_id for record in finished]
    doomed = [run_id for run_id in old if run_id not in kept][:max_runs]
    delete_runs(instance, doomed)
    runless = delete_runless_events(instance, before)
    storage = instance.schedule_storage
    if storage is not None and storage.supports_auto_materialize_asset_evaluations:
        storage.purge_asset_evaluations(before=before.timestamp())
    return HistoryPruned(
        runs=len(doomed),
        runs_kept_for_assets=sum(run_id in kept for run_id in old),
        runless_events=runless,
        evaluations_before=before,
    )


class HistoryConfig(dg.Config):
    """How long Dagster's history stays (editable in the launchpad)."""

    retention_hours: int | None = Field(
        default=None,
        ge=1,
        description="Delete successful runs, runless landing materializations and automation "
        "evaluations older than this (default CLAW_RUN_HISTORY_HOURS).",
    )


@dg.op(
    description="Delete the successful runs (but those holding an asset's latest "
    "materialization), the landing tables' runless materializations and the automation "
    "sensor's evaluations older than the retention."
)
def prune_dagster_history(context: dg.OpExecutionContext, config: HistoryConfig) -> None:
    hours = config.retention_hours or get_settings().run_history_hours
    pruned = prune_history(context.instance, datetime.now(UTC) - timedelta(hours=hours))
    context.log.info(
        "deleted %d runs (%d older kept: they hold an asset's latest materialization) and %d "
        "runless landing materializations, and the automation evaluations, before %s",
        pruned.runs,
        pruned.runs_kept_for_assets,
        pruned.runless_events,
        pruned.evaluations_before,
    )


@dg.job(description="Deletes Dagster's history older than CLAW_RUN_HISTORY_HOURS.")
def dagster_history():
    prune_dagster_history()


dagster_history_schedule = dg.ScheduleDefinition(
    job=dagster_history,
    cron_schedule=HISTORY_CRON,
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
