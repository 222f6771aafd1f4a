"""What the instance's run queue holds, for sensors that must not launch work already coming."""

import dagster as dg

QUEUED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
"""Runs that have not read anything yet: whatever lands now, they will see."""

TO_COME = [*QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]

RECENT_RUNS = 25
"""How many of the newest runs in those states are looked at (the queue is a handful)."""


def has_run(instance: dg.DagsterInstance, key: str, statuses: list[dg.DagsterRunStatus]) -> bool:
    """Whether a run that materializes asset ``key`` is in one of ``statuses``."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=statuses), limit=RECENT_RUNS)
    return any(dg.AssetKey(key) in (run.asset_selection or ()) for run in runs)


def has_run_before(instance: dg.DagsterInstance, key: str) -> bool:
    """Whether a run that materializes asset ``key`` has yet to start that step: queued, or
    launched and waiting for the step's pool slot. Such a run reads whatever lands before the
    step starts, so another run for the same new data would only wait behind it."""
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=TO_COME), limit=RECENT_RUNS):
        if dg.AssetKey(key) not in (run.asset_selection or ()):
            continue
        if run.status in QUEUED:
            return True
        started = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
        if not any(event.step_key == key for event in started):
            return True
    return False
