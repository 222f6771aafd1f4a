"""The asset graph run in-process over real Delta tables: landing -> steps -> ... -> batch."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster_harness import CHAIN, Driver, KilledOnCall
from dagster_rollouts import Rollouts, land_rollouts, late_turn
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from assets.batches import build_batch_asset
from assets.checks import unique_step_ids
from claw_pipelines.incremental.closed_tails import ClosedTails
from claw_pipelines.config_files import recipes
from claw_pipelines.incremental.increment import WRITER, ConcurrentRun, Increment
from claw_pipelines.derived_schemas import (
    BATCH_ROWS,
    OPEN_STATE,
    STEPS,
    TOKEN_COLUMNS,
    conform,
    empty,
    fit,
)
from claw_pipelines.lake import Lake, VersionsVacuumed, changes, column_bound, compact, keyed
from claw_pipelines.schemas import TrajectoryEventRow, Turn, new_id, rows_to_arrow, utc_now
from claw_pipelines.transforms.credit import CreditAssignment


@pytest.fixture
def driver(bound, instance) -> Driver:
    return Driver(bound, instance)


def _batch_rows(lake, batch_id: str) -> pl.DataFrame:
    return (
        lake.scan("batches/grpo")
        .filter(pl.col("batch_id") == batch_id)
        .sort("group_id", "trajectory_id", "step_index")
        .collect()
    )


def assert_batch_matches(rows: pl.DataFrame, landed: Rollouts, group_size: int) -> None:
    """Complete groups, token IDs equal to the landed turns', outcome rewards on every step
    (the shipped grpo recipe broadcasts the trajectory outcome)."""
    sizes = rows.group_by("group_id").agg(pl.col("trajectory_id").n_unique().alias("n"))
    assert sizes.get_column("n").to_list() == [group_size] * sizes.height
    for row in rows.iter_rows(named=True):
        turn = landed.turns[row["turn_id"]]
        assert row["prompt_token_ids"] == turn["prompt_token_ids"]
        assert row["response_token_ids"] == turn["response_token_ids"]
        assert row["trajectory_id"] == turn["trajectory_id"]
        assert row["reward"] == pytest.approx(landed.rewards[row["trajectory_id"]])


@pytest.mark.parametrize("compact_after_files", [64, 1], ids=["shipped", "compacting-each-run"])
def test_landing_to_exported_grpo_batch_incrementally(
    driver: Driver, bound, monkeypatch, compact_after_files: int
) -> None:
    """Also with every derived, ledger and batch table compacted after each commit: merges
    change no data, so batches, ledgers and re-materialized partitions stay the same."""
    from claw_pipelines.batching import building, ledger
    from claw_pipelines.incremental import closed_tails, increment

    for module in (increment, closed_tails, ledger, building):
        monkeypatch.setattr(module, "COMPACT_AFTER_FILES", compact_after_files)
    landed = land_rollouts(bound.lake, groups=5, group_size=4, steps=2)
    first_turns = bound.lake.version("turns")
    metadata = driver.refresh()
    assert metadata["steps"]["read_versions"]["turns"] == [None, first_turns]
    assert metadata["steps"]["rows_read"]["turns"] == 40
    assert "step 0 of rollout" in metadata["steps"]["sample"]
    assert "null: 0" in metadata["rewarded_steps"]["reward_distribution"]
    assert metadata["curated_steps"]["dagster/row_count"] == 40

    planned = driver.tick("batch_grpo_planner")
    assert isinstance(planned, dg.SensorResult)
    (request,) = planned.run_requests  # 5 complete groups: one batch of 4, one group left
    batch_id = request.partition_key
    assert batch_id == "grpo-000001"
    launched = [key.to_user_string() for key in request.asset_selection]
    assert launched == ["batch_grpo", "export_grpo"]  # the batch and its export in one run
    result = driver.materialize(launched, partition_key=batch_id)
    batch_meta = driver.metadata(result, "batch_grpo")
    assert batch_meta["groups"] == 4
    assert batch_meta["pinned_versions"]["curated_steps"] == bound.lake.version("curated_steps")
    rows = _batch_rows(bound.lake, batch_id)
    assert rows.height == 32
    assert_batch_matches(rows, landed, group_size=4)
    manifest = json.loads(
        (Path(bound.lake.uri(f"exports/grpo/{batch_id}")) / "manifest.json").read_text()
    )
    assert manifest["batch_id"] == batch_id and manifest["rows"] == 32

    # A re-run with nothing new reads an empty version range and duplicates nothing.
    again = driver.refresh()
    assert again["steps"]["read_versions"]["turns"] == [first_turns, first_turns]
    assert again["curated_steps"]["dagster/row_count"] == 40

    # New turns: each asset reads only the new versions.
    landed_later = land_rollouts(bound.lake, groups=3, group_size=4, steps=2, seed=1)
    later = driver.refresh()
    assert later["steps"]["read_versions"]["turns"] == [first_turns, first_turns + 1]
    assert later["steps"]["rows_read"]["turns"] == later["steps"]["rows_written"] == 24
    for key in CHAIN[2:]:
        assert later[key]["dagster/row_count"] == 64, key
    all_steps = bound.lake.scan("steps").collect()
    assert all_steps.height == all_steps.get_column("step_id").n_unique() == 64

    # Re-materializing the first batch after more data landed reproduces it exactly.
    driver.materialize(["batch_grpo"], partition_key=batch_id)
    reproduced = _batch_rows(bound.lake, batch_id)
    assert reproduced.columns == rows.columns
    assert reproduced.equals(rows), "a re-materialized batch differs in some column"
    # So does re-materializing it once the recipe was edited: the batch keeps the recipe it was
    # planned under (here its credit assignment), new batches get the edit.
    edited = recipes()["grpo"].model_copy(update={"credit_assignment": CreditAssignment()})
    dg.materialize(
        [build_batch_asset(edited)],
        instance=driver.instance,
        resources={"lake": bound.resource},
        partition_key=batch_id,
    )
    under_edit = _batch_rows(bound.lake, batch_id)
    assert under_edit.equals(rows), "a batch re-materialized under an edited recipe changed"

    # The 4 groups left over make the second batch, with none of the first batch's steps.
    (second,) = driver.tick("batch_grpo_planner").run_requests
    driver.materialize(["batch_grpo"], partition_key=second.partition_key)
    second_rows = _batch_rows(bound.lake, second.partition_key)
    landed.turns.update(landed_later.turns)
    landed.rewards.update(landed_later.rewards)
    assert_batch_matches(second_rows, landed, group_size=4)
    assert not set(second_rows["turn_id"]) & set(rows["turn_id"])
    ledger = bound.lake.scan("batch_ledger/grpo").collect()
    assert ledger.height == ledger.get_column("turn_id").n_unique() == 64
    assert isinstance(driver.tick("batch_grpo_planner"), dg.SkipReason)

    # The other shipped recipes batch the same steps independently, in their own formats.
    for recipe in ("dpo", "sft"):
        (request, *_) = driver.tick(f"batch_{recipe}_planner").run_requests
        result = driver.materialize(
            [f"batch_{recipe}", f"export_{recipe}"], partition_key=request.partition_key
        )
        assert driver.metadata(result, f"batch_{recipe}")["dagster/partition_row_count"] > 0
        manifest = driver.metadata(result, f"export_{recipe}")["manifest"]
        assert manifest["algorithm"] == recipe and manifest["files"]
        assert manifest["planned_with"]["recipe"]["name"] == recipe
    if compact_after_files == 1:
        for table in (*CHAIN, "steps_tails", "batch_ledger/grpo", "batches/grpo"):
            history = bound.lake.open(table).history()
            assert "OPTIMIZE" in {commit["operation"] for commit in history}, table


def test_an_export_whose_write_failed_is_retried_in_its_run(
    driver: Driver, bound, monkeypatch
) -> None:
    """Nothing else would export a batch its own run built, so a failed write is retried."""
    import assets.batch_work

    export_batch, failures = assets.batch_work.export_batch, []

    def fails_once(*args, **kwargs):
        if not failures:
            failures.append(OSError("connection reset by the object store"))
            raise failures[0]
        return export_batch(*args, **kwargs)

    monkeypatch.setattr(assets.batch_work, "export_batch", fails_once)
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1)
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    result = driver.materialize(["batch_grpo", "export_grpo"], partition_key=request.partition_key)
    assert failures, "the export never failed"
    retried = [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]
    assert [e.step_key for e in retried] == ["export_grpo"]
    manifest = driver.metadata(result, "export_grpo")["manifest"]
    assert manifest["batch_id"] == request.partition_key and manifest["rows"] == 16


def test_a_stale_concurrent_run_cannot_commit_twice(bound) -> None:
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    bound.lake.ensure("steps", STEPS)
    first = Increment.begin(bound.lake, "steps", "steps", ["turns"])
    second = Increment.begin(bound.lake, "steps", "steps", ["turns"])
    rows = conform(empty(STEPS), STEPS)
    first.commit(rows)
    with pytest.raises(ConcurrentRun):
        second.commit(rows)
    turns_version = bound.lake.version("turns")
    assert bound.lake.open("steps").transaction_version("claw/steps/turns") == turns_version


def test_tables_from_before_request_tools_gain_the_column(driver: Driver, bound) -> None:
    """A lake whose steps and batch tables predate ``request_tools``: the next run of each
    merges the column in, even a steps run with nothing new (so its schema check passes), and
    batches and their TRL export carry the tools."""
    for table, schema in {"steps": STEPS, "batches/grpo": BATCH_ROWS}.items():
        bound.lake.ensure(table, pa.schema([f for f in schema if f.name != "request_tools"]))
    driver.materialize(["steps"])
    assert "request_tools" in bound.lake.scan("steps").collect_schema().names()
    tools = json.dumps([{"type": "function", "function": {"name": "calc"}}])
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1, request_tools=tools)
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    driver.materialize(["batch_grpo", "export_grpo"], partition_key=request.partition_key)
    assert set(bound.lake.scan("batches/grpo").collect()["request_tools"]) == {tools}
    export = Path(bound.lake.uri(f"exports/grpo/{request.partition_key}"))
    assert set(pl.read_parquet(export / "trl/prompts.parquet")["tools"]) == {tools}


def test_new_landing_versions_trigger_automation(driver: Driver, bound, instance) -> None:
    assert isinstance(driver.tick("landing_ingest_sensor"), dg.SkipReason)
    before = dg.evaluate_automation_conditions(defs=bound.defs, instance=instance)
    assert before.total_requested == 0
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    ticked = driver.tick("landing_ingest_sensor")
    assert {e.asset_key.path[-1] for e in ticked.asset_events} == {"turns", "trajectory_events"}
    assert json.loads(driver.cursors["landing_ingest_sensor"]) == {
        "trajectory_events": bound.lake.version("trajectory_events"),
        "turns": bound.lake.version("turns"),
    }
    evaluation = dg.evaluate_automation_conditions(
        defs=bound.defs, instance=instance, cursor=before.cursor
    )
    requested = {key for key in CHAIN if evaluation.get_num_requested(dg.AssetKey(key))}
    assert requested == set(CHAIN)
    assert not evaluation.get_num_requested(dg.AssetKey("export_grpo"))


def test_a_failed_blocking_check_stops_the_chain_at_the_asset_that_wrote_the_rows(
    driver: Driver, bound
) -> None:
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    turn = next(iter(landed.turns.values()))
    bad = {**turn, "turn_id": new_id(), "trajectory_id": "t-bad", "response_logprobs": [-0.5]}
    bound.lake.append("turns", rows_to_arrow(Turn, [bad]))
    done = TrajectoryEventRow(trajectory_id="t-bad", group_id=turn["group_id"], reward=1.0)
    bound.lake.append("trajectory_events", rows_to_arrow(TrajectoryEventRow, [done.model_dump()]))
    result = driver.attempt(CHAIN)
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not checks["logprobs_aligned"].passed
    assert checks["logprobs_aligned"].metadata["misaligned_step_ids"].value == [bad["turn_id"]]
    assert checks["unique_step_ids"].passed and checks["schema_unchanged"].passed
    assert not result.success
    assert not result.asset_materializations_for_node("rewarded_steps")


@pytest.mark.parametrize("crashes", [1, 12])
def test_steps_recover_from_a_crash_between_state_and_output(
    driver: Driver, bound, crashes: int
) -> None:
    """The state commit lands first; if the run dies before the steps commit (again and again,
    say until an operator steps in), the next run must take the state matching the steps'
    watermark, so nothing is lost or emitted twice."""
    land_rollouts(bound.lake, groups=1, group_size=2, steps=2, complete=False)
    driver.refresh()  # turns of open trajectories: all in the state, no steps yet
    land_rollouts(bound.lake, groups=1, group_size=2, steps=2, seed=3)
    for _ in range(crashes):
        crashed = Increment.begin(bound.lake, "steps", "steps", ["turns", "trajectory_events"])
        crashed.replace_state("steps_open", empty(OPEN_STATE), OPEN_STATE)
    metadata = driver.refresh()
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique()
    assert metadata["steps"]["open_turns"] == 4  # the first group never completed
    assert steps.height == 4


def test_an_idle_sweep_dying_before_its_commit_loses_no_step(
    driver: Driver, bound, monkeypatch
) -> None:
    """A sweep with no new data that closes idle trajectories writes its state, then their
    steps; if it dies in between, its state must not be taken as the current one (it names
    the same input versions), or those trajectories would count as emitted and never be."""
    import assets.steps

    land_rollouts(bound.lake, groups=1, group_size=2, steps=2, complete=False)
    assert driver.refresh()["steps"]["open_turns"] == 4
    an_hour_later = utc_now() + timedelta(hours=1)
    monkeypatch.setattr(assets.steps, "utc_now", lambda: an_hour_later)
    commit = KilledOnCall(Increment.commit, n=1)
    monkeypatch.setattr(Increment, "commit", lambda self, *a, **k: commit(self, *a, **k))
    assert not driver.attempt(["steps"]).success
    assert bound.lake.scan("steps").collect().is_empty()

    driver.materialize(["steps"])
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 4
    assert set(steps.get_column("close_reason")) == {"timeout"}


def _last_turn(landed: Rollouts, trajectory_id: str) -> dict:
    turns = [t for t in landed.turns.values() if t["trajectory_id"] == trajectory_id]
    return max(turns, key=lambda t: t["started_at"])


def _steps_of(lake: Lake, trajectory_id: str) -> pl.DataFrame:
    return (
        lake.scan("steps")
        .filter(pl.col("trajectory_id") == trajectory_id)
        .sort("step_index")
        .collect()
    )


def test_late_turns_extend_a_closed_trajectory_from_its_tail(driver: Driver, bound) -> None:
    """A closed trajectory keeps a tail in ``steps_tails``: a turn landing after completion is
    emitted as a reopened step numbered after the emitted ones and prefix-checked against the
    last, a re-delivered turn is dropped, and a run appends only the tails it changed."""
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2)
    driver.refresh()
    assert bound.lake.scan("steps_tails").collect().height == 2
    reopened, other = next(iter(landed.groups.values()))
    last = _last_turn(landed, reopened)
    first = min(landed.turns.values(), key=lambda t: t["started_at"])
    bound.lake.append("turns", rows_to_arrow(Turn, [late_turn(last), first]))

    assert driver.refresh()["steps"]["rows_written"] == 1
    steps = _steps_of(bound.lake, reopened)
    assert steps.get_column("step_index").to_list() == [0, 1, 2]
    assert steps.get_column("reopened").to_list() == [False, False, True]
    assert steps.get_column("prefix_consistent").all()
    tails = bound.lake.scan("steps_tails").collect()
    assert tails.filter(pl.col("trajectory_id") == reopened).get_column(
        "step_index"
    ).sort().to_list() == [1, 2]
    assert tails.filter(pl.col("trajectory_id") == other).height == 1
    assert bound.lake.scan("steps_open").collect().is_empty()


def test_closed_tails_kept_in_steps_open_by_older_lakes_move_to_the_log(
    driver: Driver, bound
) -> None:
    """Lakes written before ``steps_tails`` kept closed tails in ``steps_open``; the next run
    moves them to the log and a late turn still continues its trajectory."""
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2)
    driver.refresh()
    tails = bound.lake.scan("steps_tails").collect()
    output = bound.lake.open("steps")
    watermark = [
        Transaction(app_id=app, version=output.transaction_version(app))
        for app in ("claw/steps/turns", "claw/steps/trajectory_events", "claw/steps/run")
    ]
    write_deltalake(
        bound.lake.open("steps_open"),
        conform(fit(tails, OPEN_STATE), OPEN_STATE),
        mode="overwrite",
        commit_properties=CommitProperties(app_transactions=watermark),
    )
    shutil.rmtree(bound.lake.uri("steps_tails"))
    trajectory_id = next(iter(landed.groups.values()))[0]
    bound.lake.append("turns", rows_to_arrow(Turn, [late_turn(_last_turn(landed, trajectory_id))]))

    driver.refresh()
    steps = _steps_of(bound.lake, trajectory_id)
    assert steps.get_column("step_index").to_list() == [0, 1, 2]
    assert steps.get_column("reopened").to_list() == [False, False, True]
    assert bound.lake.scan("steps_tails").collect().height == 3
    assert bound.lake.scan("steps_open").collect().is_empty()


def test_tails_past_the_reopen_window_leave_the_log(driver: Driver, bound, monkeypatch) -> None:
    """A run that commits deletes the tails closed before the reopen window, compacts a log of
    many small files and drops the state files no version needs any more; a turn landing after
    the window starts a new emission."""
    import claw_pipelines.incremental.closed_tails
    import assets.steps

    monkeypatch.setattr(claw_pipelines.incremental.closed_tails, "COMPACT_AFTER_FILES", 2)
    landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    driver.refresh()
    for seed in (1, 2):
        land_rollouts(bound.lake, groups=1, group_size=1, steps=1, seed=seed)
        driver.refresh()
    assert len(bound.lake.open("steps_tails").file_uris()) == 1  # compacted
    for state in ("steps_tails", "steps_open"):  # files of older versions are dropped
        on_disk = list(Path(bound.lake.uri(state)).glob("*.parquet"))
        assert len(on_disk) == len(bound.lake.open(state).file_uris()), state
    two_days_later = utc_now() + timedelta(days=2)
    monkeypatch.setattr(assets.steps, "utc_now", lambda: two_days_later)
    trajectory_id = next(iter(landed.groups.values()))[0]
    last = _last_turn(landed, trajectory_id)
    bound.lake.append("turns", rows_to_arrow(Turn, [late_turn(last, timedelta(days=2))]))
    events = [TrajectoryEventRow(trajectory_id=trajectory_id, reward=1.0).model_dump()]
    bound.lake.append("trajectory_events", rows_to_arrow(TrajectoryEventRow, events))

    driver.refresh()
    tails = bound.lake.scan("steps_tails").collect()
    assert tails.get_column("trajectory_id").to_list() == [trajectory_id]
    assert _steps_of(bound.lake, trajectory_id).get_column("step_index").to_list() == [0, 0]


VACUUM_NOW = {
    "ops": {
        "maintain_landing_tables": {
            "config": {"vacuum_retention_hours": 0, "enforce_retention_duration": False}
        }
    }
}


def _files_on_disk(lake: Lake, table: str) -> int:
    return len(list(Path(lake.uri(table)).glob("*.parquet")))


def test_compacting_landing_tables_reads_no_turn_twice(driver: Driver, bound, monkeypatch) -> None:
    """The scheduled job merges the landing tables' small files; the ingest sensor does not
    report the merge as new data, and the steps asset's change-feed read skips it, so no turn is
    read twice and then only turns landed after it. The default retention keeps the merged
    files (they are younger than 7 days)."""
    import assets.maintenance

    monkeypatch.setattr(assets.maintenance, "COMPACT_AFTER_FILES", 2)
    for seed in range(3):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    driver.refresh()
    job = bound.defs.resolve_job_def("landing_maintenance")
    assert job.execute_in_process(instance=driver.instance).success
    for table in ("turns", "trajectory_events"):
        assert len(bound.lake.open(table).file_uris()) == 1, table
        assert _files_on_disk(bound.lake, table) == 4, table

    assert isinstance(driver.tick("landing_ingest_sensor"), dg.SkipReason)  # no new data
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 0
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=3)
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 2
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 8


def test_vacuuming_landing_tables_deletes_the_merged_files_and_keeps_every_row(
    driver: Driver, bound, monkeypatch
) -> None:
    """Past the retention (0 here, enforcement off) the job deletes the files it merged; the
    rows are unchanged, the vacuum commits are not new data, and the chain reads on."""
    import assets.maintenance

    monkeypatch.setattr(assets.maintenance, "COMPACT_AFTER_FILES", 2)
    for seed in range(3):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    driver.refresh()
    landed = {table: bound.lake.scan(table).collect() for table in ("turns", "trajectory_events")}
    job = bound.defs.resolve_job_def("landing_maintenance")
    assert job.execute_in_process(instance=driver.instance, run_config=VACUUM_NOW).success
    for table, rows in landed.items():
        assert _files_on_disk(bound.lake, table) == 1, table
        kept = bound.lake.scan(table).collect()
        assert kept.sort(kept.columns).equals(rows.sort(rows.columns)), table
    assert isinstance(driver.tick("landing_ingest_sensor"), dg.SkipReason)
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=3)
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 2


def test_the_retention_is_enforced_unless_turned_off(driver: Driver, bound) -> None:
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    too_short = {"ops": {"maintain_landing_tables": {"config": {"vacuum_retention_hours": 1}}}}
    job = bound.defs.resolve_job_def("landing_maintenance")
    result = job.execute_in_process(
        instance=driver.instance, run_config=too_short, raise_on_error=False
    )
    assert not result.success
    refused = result.failure_data_for_node("maintain_landing_tables").error.cause
    assert "minimum retention for vacuum" in refused.message


def test_the_vacuum_keeps_what_a_lagging_reader_has_yet_to_read(
    driver: Driver, bound, monkeypatch
) -> None:
    """The steps asset read turns up to a version; the versions after it are merged, and the job
    vacuums with retention 0: it keeps their files, so steps reads on and misses no turn."""
    import assets.maintenance

    monkeypatch.setattr(assets.maintenance, "COMPACT_AFTER_FILES", 2)
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    driver.refresh()
    for seed in (1, 2):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    job = bound.defs.resolve_job_def("landing_maintenance")
    assert job.execute_in_process(instance=driver.instance, run_config=VACUUM_NOW).success
    assert len(bound.lake.open("turns").file_uris()) == 1
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 4
    assert bound.lake.scan("steps").collect().height == 6
    assert job.execute_in_process(instance=driver.instance, run_config=VACUUM_NOW).success
    assert _files_on_disk(bound.lake, "turns") == 1  # everyone read on: the merged files go


def test_a_reader_whose_versions_were_vacuumed_elsewhere_fails_clearly(
    driver: Driver, bound
) -> None:
    """A vacuum outside the job deletes the files of versions the steps asset has yet to read:
    its change-feed read says so instead of failing on a missing file. A read from the start
    takes the snapshot, every row at the latest version."""
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    driver.refresh()
    for seed in (1, 2):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    compact(bound.lake.open("turns"), max_files=1)
    bound.lake.vacuum("turns", 0, enforce_retention_duration=False)
    turns, read = bound.lake.open("turns"), bound.lake.open("steps").transaction_version(
        "claw/steps/turns")  # fmt: skip
    with pytest.raises(VersionsVacuumed, match="fell further behind than the vacuum retention"):
        changes(turns, read, turns.version())
    result = driver.attempt(["steps"])
    assert not result.success
    assert result.failure_data_for_node("steps").error.cause.cls_name == "VersionsVacuumed"
    rows = changes(turns, None, turns.version(), ["turn_id"], with_version=True)
    assert rows.height == 6 and set(rows["_commit_version"]) == {turns.version()}


def test_chunked_recompute_survives_a_crash_part_way(driver: Driver, bound, monkeypatch) -> None:
    """Big backlogs are recomputed a few trajectories per commit; a run dying after some chunks
    committed (watermark not moved yet) is redone by the next run without duplicates."""
    import claw_pipelines.incremental.increment
    import assets.quality

    monkeypatch.setattr(claw_pipelines.incremental.increment, "CHUNK_TRAJECTORIES", 3)
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1)
    monkeypatch.setattr(
        assets.quality, "score_steps", KilledOnCall(assets.quality.score_steps, n=3)
    )
    driver.tick("landing_ingest_sensor")
    assert not driver.attempt(CHAIN).success
    partial = bound.lake.scan("scored_steps").collect()
    assert partial.height == 6  # two chunks of 3 one-step trajectories committed
    assert (
        bound.lake.open("scored_steps").transaction_version("claw/scored_steps/rewarded_steps")
        is None
    )

    metadata = driver.refresh()
    assert metadata["scored_steps"]["rows_written"] == 16
    for key in CHAIN:
        table = bound.lake.scan(key).collect()
        assert table.height == 16, key  # one-step trajectories: as many rows as steps
    scored = bound.lake.scan("scored_steps").collect()
    assert scored.get_column("step_id").n_unique() == 16


def test_a_turns_backlog_is_extracted_in_chunks_that_survive_a_crash(
    driver: Driver, bound, monkeypatch
) -> None:
    """A backlog of turn versions is extracted a chunk per commit; a run dying after a chunk
    committed is redone by the next run without duplicates, with the steps of one pass."""
    import assets.steps
    from claw_pipelines.incremental import turn_chunks

    monkeypatch.setattr(turn_chunks, "CHUNK_TURNS", 4)
    for seed in range(3):  # three turns versions of 4 turns (2 two-step trajectories) each
        land_rollouts(bound.lake, groups=1, group_size=2, steps=2, seed=seed)
    extract = KilledOnCall(assets.steps.extract_steps, n=2)
    monkeypatch.setattr(assets.steps, "extract_steps", extract)
    driver.tick("landing_ingest_sensor")
    assert not driver.attempt(["steps"]).success
    assert bound.lake.scan("steps").collect().height == 4  # the first chunk committed
    assert bound.lake.open("steps").transaction_version("claw/steps/turns") is None

    metadata = driver.refresh()
    assert extract.calls == 5  # the crashed run's two calls, then three chunks
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 12
    assert metadata["steps"]["rows_written"] == 12
    assert steps.get_column("prefix_consistent").all()
    assert not steps.get_column("reopened").any()
    assert set(steps.get_column("step_index")) == {0, 1}
    committed = bound.lake.open("steps").transaction_version("claw/steps/attempt")
    tails = ClosedTails.for_attempt(bound.lake, run=0, attempt=0, committed=committed)
    counted = tails.scan().collect()  # the crashed run's tails stay in the log, uncounted
    assert counted.height == counted.get_column("trajectory_id").n_unique() == 6


def test_a_first_build_from_a_vacuumed_landing_table_is_chunked_by_trajectory(
    driver: Driver, bound, monkeypatch
) -> None:
    """A landing table whose merged files were vacuumed reads as one version (its snapshot):
    steps rebuilt from it are still extracted a chunk of whole trajectories at a time, with
    the steps of one pass."""
    import assets.steps
    from claw_pipelines.incremental import turn_chunks

    monkeypatch.setattr(turn_chunks, "CHUNK_TURNS", 4)
    for seed in range(3):  # 12 turns: 6 two-step trajectories
        landed = land_rollouts(bound.lake, groups=1, group_size=2, steps=2, seed=seed)
    anonymous = [  # and a two-turn trajectory that came without identity, still open
        {**turn, "turn_id": new_id(), "trajectory_id": None, "group_id": None}
        for turn in list(landed.turns.values())[:2]
    ]
    bound.lake.append("turns", rows_to_arrow(Turn, anonymous))
    for table in ("turns", "trajectory_events"):
        compact(bound.lake.open(table), max_files=1)
        bound.lake.vacuum(table, 0, enforce_retention_duration=False)
    chunks, extract = [], assets.steps.extract_steps

    def recording(turns: pl.DataFrame, *args, **kwargs):
        chunks.append(turns)
        return extract(turns, *args, **kwargs)

    monkeypatch.setattr(assets.steps, "extract_steps", recording)
    driver.tick("landing_ingest_sensor")
    assert driver.attempt(["steps"]).success
    assert [chunk.height for chunk in chunks] == [4, 4, 6]
    for chunk in chunks:  # whole trajectories per chunk, the anonymous turns in the last
        assert set(chunk.group_by("trajectory_id").len().get_column("len")) == {2}
    inferred = bound.lake.scan("steps_open").filter(pl.col("state") == "open").collect()
    assert inferred.height == 2 and inferred.get_column("trajectory_id").n_unique() == 1
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 12
    assert steps.get_column("prefix_consistent").all()
    assert steps.group_by("trajectory_id").agg(pl.col("step_index").sort()).get_column(
        "step_index").to_list() == [[0, 1]] * 6  # fmt: skip
    assert steps.filter(pl.col("is_last")).height == 6


def test_unique_step_ids_checks_the_new_ids_against_the_whole_table() -> None:
    table = pl.LazyFrame({"step_id": ["s-1", "s-2", "s-2", "s-3"]})
    assert unique_step_ids(table, pl.Series(["s-3"])).passed
    failed = unique_step_ids(table, pl.Series(["s-2", "s-3"]))
    assert not failed.passed
    assert failed.metadata["duplicated_step_ids"].value == ["s-2"]


def test_keyed_reads_exactly_the_keys_across_files(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    for ids in (["t-1", "t-2", "t-3"], ["t-4", "t-5"]):
        lake.append("ids", pa.table({"id": ids}))
    ids = lake.scan("ids")
    picked = keyed(ids, "id", pl.Series(["t-5", None, "t-2", "t-9", "t-5"])).collect()
    assert sorted(picked.get_column("id")) == ["t-2", "t-5"]
    assert keyed(ids, "id", pl.Series([None], dtype=pl.String)).collect().is_empty()


def test_column_bound_comes_from_file_statistics_and_falls_back_to_a_scan(tmp_path: Path) -> None:
    """The newest policy version and the oldest closed tail are read from the files'
    statistics: they hold with the data files gone. A table written without statistics is
    scanned instead."""
    versions = [pa.table({"v": pa.array(v, pa.int64())}) for v in ([1, 3], [None, None], [7, 2])]
    with_stats, without = str(tmp_path / "with"), str(tmp_path / "without")
    for table in versions:
        write_deltalake(with_stats, table, mode="append")
        write_deltalake(
            without,
            table,
            mode="append",
            configuration={"delta.dataSkippingNumIndexedCols": "0"},
        )
    for data_file in Path(with_stats).glob("*.parquet"):
        data_file.unlink()
    for bound, expected in (("max", 7), ("min", 1)):
        assert column_bound(DeltaTable(with_stats), "v", bound) == expected
        assert column_bound(DeltaTable(without), "v", bound) == expected


def test_derived_tables_keep_statistics_for_flat_columns_only(tmp_path: Path) -> None:
    """Files and row groups are skipped by ids, times and versions, so those keep their
    statistics; the token lists, which no reader filters on, are written without."""
    steps = Path(tmp_path / "steps")
    names = ["step_id", "turn_id", "trajectory_id", "policy_version", *TOKEN_COLUMNS]
    rows = pa.table(
        [["s-1"], ["u-1"], ["t-1"], [3], [[1, 2]], [[3]], [[-0.1]]],
        schema=pa.schema([STEPS.field(name) for name in names]),
    )
    write_deltalake(str(steps), rows, writer_properties=WRITER)
    (data_file,) = steps.glob("*.parquet")
    chunks = pq.ParquetFile(data_file).metadata.row_group(0)
    with_min_max = {
        chunk.path_in_schema.split(".")[0]
        for chunk in (chunks.column(i) for i in range(chunks.num_columns))
        if chunk.statistics is not None and chunk.statistics.has_min_max
    }
    assert {"step_id", "turn_id", "trajectory_id", "policy_version"} <= with_min_max
    assert not with_min_max & set(TOKEN_COLUMNS)
    assert column_bound(DeltaTable(str(steps)), "policy_version", "max") == 3


def test_a_compaction_another_writer_got_ahead_of_is_skipped(tmp_path: Path) -> None:
    """Compaction runs after a run's own commit: when another writer removed files it would
    merge, it is skipped (the run's commit stands) and the other writer's rows are intact."""
    uri = str(tmp_path / "t")
    for batch in ("a", "b", "c"):
        write_deltalake(uri, pa.table({"batch_id": [batch]}), mode="append")
    stale = DeltaTable(uri)
    DeltaTable(uri).delete("batch_id = 'b'")
    compact(stale, max_files=1)
    assert stale.version() == 2
    assert sorted(pl.scan_delta(uri).collect()["batch_id"]) == ["a", "c"]
    compact(DeltaTable(uri), max_files=1)
    assert len(DeltaTable(uri).file_uris()) == 1
