"""Dagster's history kept for a retention (``assets/history.py``), on a real SQLite instance:
old successful runs go with their event files, check executions and captured logs, the runs
holding an asset's latest materialization and failed runs stay, and so does each landing
table's latest runless materialization."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
from dagster._core.definitions.declarative_automation.serialized_objects import (
    AutomationConditionEvaluationWithRunIds,
)
from dagster_harness import Bound

from assets.history import prune_history


@dg.asset(automation_condition=dg.AutomationCondition.eager())
def often() -> None:
    """Refreshed by every run."""


@dg.asset_check(asset=often)
def often_checked() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


@dg.asset
def once() -> None:
    """Refreshed by the first run only: that run holds its latest materialization."""


@dg.asset
def broken() -> None:
    raise RuntimeError("fails, so its run stays to be looked at")


def _evaluate(instance: dg.DagsterInstance) -> None:
    """Store one automation evaluation of ``often``, as the automation sensor does each tick."""
    result = dg.evaluate_automation_conditions(defs=[often], instance=instance).results[0]
    instance.schedule_storage.add_auto_materialize_asset_evaluations(
        1, [AutomationConditionEvaluationWithRunIds(result.serializable_evaluation, frozenset())]
    )


def test_old_history_goes_but_each_assets_latest_and_failures_stay(
    tmp_path: Path, bound: Bound
) -> None:
    """The code location's hourly job keeps a day (an hour here); past it, what goes and what
    stays."""
    instance = dg.DagsterInstance.local_temp(str(tmp_path))
    first = dg.materialize([often, often_checked, once], instance=instance).run_id
    middle = dg.materialize([often, often_checked], instance=instance).run_id
    last = dg.materialize([often, often_checked], instance=instance).run_id
    failed = dg.materialize([broken], instance=instance, raise_on_error=False).run_id
    for _ in range(3):
        instance.report_runless_asset_event(dg.AssetMaterialization("turns"))
    _evaluate(instance)
    events = instance.event_log_storage
    check = often_checked.check_key

    def left() -> dict:
        return {
            "runs": {r.run_id for r in instance.get_runs()},
            "event_files": {
                r for r in (first, middle, last) if Path(events.path_for_shard(r)).exists()
            },
            "logs": {r for r in (first, middle, last) if (tmp_path / "storage" / r).exists()},
            "checks": len(events.get_asset_check_execution_history(check, limit=10)),
            "runless": len(instance.fetch_materializations(dg.AssetKey("turns"), limit=10).records),
            "evaluations": len(
                instance.schedule_storage.get_auto_materialize_asset_evaluations(often.key, 10)
            ),
        }

    everything = left()
    assert everything == {
        "runs": {first, middle, last, failed},
        "event_files": {first, middle, last},
        "logs": {first, middle, last},
        "checks": 3,
        "runless": 3,
        "evaluations": 1,
    }
    schedule = bound.defs.resolve_schedule_def("dagster_history_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    configured = bound.defs.resolve_job_def(schedule.job_name).execute_in_process(
        instance=instance,
        run_config={"ops": {"prune_dagster_history": {"config": {"retention_hours": 1}}}},
    )
    assert configured.success
    assert left() == everything | {"runs": everything["runs"] | {configured.run_id}}

    pruned = prune_history(instance, datetime.now(UTC) + timedelta(seconds=1))
    assert (pruned.runs, pruned.runs_kept_for_assets, pruned.runless_events) == (2, 2, 2)
    assert left() == {
        "runs": {first, last, failed},
        "event_files": {first, last},
        "logs": {first, last},
        "checks": 2,
        "runless": 1,
        "evaluations": 0,
    }
    assert instance.get_latest_materialization_event(once.key).run_id == first
    assert instance.get_latest_materialization_event(often.key).run_id == last
    assert prune_history(instance, datetime.now(UTC) + timedelta(seconds=1)).runs == 0
