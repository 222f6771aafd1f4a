"""What the instance's run queue holds, for sensors that must not launch work already coming."""

import dagster as dg

QUEUED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
"""Runs that have not read anything yet: whatever lands now, they will see."""

TO_COME = [*QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]

RECENT_RUNS = 25
"""How many of the newest runs in those states are looked at (the queue is a handful)."""

IN_FLIGHT = 2
"""Runs of one asset alive at once that ``has_run_before`` allows: one building batches while
the next refreshes the chain. A third would only wait for their pool slots, polling the run
storage, and slow both; once runs are slower than the data comes, fewer runs each reading more
is what catches up (a run's fixed cost, its process and its events, is most of a small one)."""


def has_run(instance: dg.DagsterInstance, key: str, statuses: list[dg.DagsterRunStatus]) -> bool:
    """Whether a run that materializes asset ``key`` is in one of ``statuses``."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=statuses), limit=RECENT_RUNS)
    return any(dg.AssetKey(key) in (run.asset_selection or ()) for run in runs)


def has_run_before(instance: dg.DagsterInstance, key: str) -> bool:
    """Whether a run that materializes asset ``key`` has yet to start that step (queued, or
    launched and waiting for the step's pool slot), or ``IN_FLIGHT`` such runs are alive. A run
    yet to start the step reads whatever lands before it does, so another run for the same new
    data would only wait behind it; the next run after those alive reads what they left."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=TO_COME), limit=RECENT_RUNS)
    alive = [run for run in runs if dg.AssetKey(key) in (run.asset_selection or ())]
    if len(alive) >= IN_FLIGHT:
        return True
    for run in alive:
        if run.status in QUEUED:
            return True
        started = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
        if not any(event.step_key == key for event in started):
            return True
    return False
