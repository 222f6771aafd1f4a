"""The asset graph run in-process over real Delta tables: landing -> steps -> ... -> batch."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster_harness import CHAIN, Driver
from dagster_rollouts import Rollouts, land_rollouts

from assets.batches import build_batch_asset
from assets.checks import unique_step_ids
from claw_pipelines.batches.rows import batch_rows
from claw_pipelines.batching import building, ledger
from claw_pipelines.config_files import recipes
from claw_pipelines.derived_schemas import (
    BATCH_ROWS,
    EXTRACTED_STEPS,
    SIGNAL_COLUMNS,
    STEPS,
    TURN_COLUMNS,
    conform,
)
from claw_pipelines.incremental import closed_tails, increment
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import ConcurrentRun
from claw_pipelines.schemas import TrajectoryEventRow, Turn, empty, new_id, rows_to_arrow
from claw_pipelines.transforms.credit import CreditAssignment


def _batch_rows(lake, batch_id: str) -> pl.DataFrame:
    """The batch's rows as exporters and trainers take them (token lists joined from turns)."""
    return batch_rows(lake, "grpo", "grpo", batch_id)


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


def assert_tokens_stored_once(lake: Lake, landed: Rollouts, batch_id: str) -> None:
    """Only ``turns`` holds the token lists and messages in the lake's tables: steps and batch
    rows point at their turns. The export is self-contained: its rollouts file alone carries
    each trajectory's token IDs as landed, one sequence per prefix-consistent trajectory (the
    shipped grpo layout): its first prompt, then every reply and observation, the replies
    under ``env_mask``."""
    for table in (*CHAIN, "batches/grpo"):
        names = lake.scan(table).collect_schema().names()
        assert not set(TURN_COLUMNS) & set(names), table
    export = Path(lake.uri(f"exports/grpo/{batch_id}"))
    rollouts = pq.read_table(export / "trl/rollouts.parquet").to_pylist()
    steps = (
        _batch_rows(lake, batch_id).group_by("trajectory_id", maintain_order=True).agg("turn_id")
    )
    assert len(rollouts) == steps.height == 16
    for row, turn_ids in zip(rollouts, steps["turn_id"], strict=True):
        first, last = landed.turns[turn_ids[0]], landed.turns[turn_ids[-1]]
        assert row["prompt_ids"] == first["prompt_token_ids"]
        sequence = last["prompt_token_ids"] + last["response_token_ids"]
        assert row["prompt_ids"] + row["completion_ids"] == sequence
        replies = sum(len(landed.turns[t]["response_token_ids"]) for t in turn_ids)
        assert sum(row["env_mask"]) == replies


@pytest.mark.parametrize("compact_after_files", [64, 1], ids=["shipped", "compacting-each-run"])
def test_landing_to_exported_grpo_batch_incrementally(
    driver: Driver, bound, monkeypatch, compact_after_files: int
) -> None:
    """Also with every derived, ledger and batch table compacted after each commit: merges
    change no data, so batches, ledgers and re-materialized partitions stay the same."""
    for module in (increment, closed_tails, ledger, building):
        monkeypatch.setattr(module, "COMPACT_AFTER_FILES", compact_after_files)
    landed = land_rollouts(bound.lake, groups=5, group_size=4, steps=2)
    first_turns = bound.lake.version("turns")
    batch_id, rows = _first_batch_exported(driver, bound, landed, first_turns)
    landed_later = _later_runs_read_only_new_versions(driver, bound, first_turns)
    _re_materialized_batch_is_the_same(driver, bound, batch_id, rows)
    landed.turns.update(landed_later.turns)
    landed.rewards.update(landed_later.rewards)
    _second_batch_takes_the_groups_left(driver, bound, landed, rows)
    _other_recipes_batch_the_same_steps(driver)
    if compact_after_files == 1:
        for table in (*CHAIN, "steps_tails", "batch_ledger/grpo", "batches/grpo"):
            history = bound.lake.open(table).history()
            assert "OPTIMIZE" in {commit["operation"] for commit in history}, table


def _first_batch_exported(
    driver: Driver, bound, landed: Rollouts, first_turns: int
) -> tuple[str, pl.DataFrame]:
    """The refresh reads every landed turn; the planner launches the first batch with its
    export. Returns its id and rows."""
    metadata = driver.refresh()
    assert metadata["steps"]["read_versions"]["turns"] == [None, first_turns]
    assert metadata["steps"]["rows_read"]["turns"] == 40
    assert "step 0 of rollout" in metadata["steps"]["sample"]
    for table in ("rewarded_steps", "scored_steps", "curated_steps"):  # replies read from turns
        assert "of rollout" in metadata[table]["sample"], table
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
    assert manifest["batch_id"] == batch_id and manifest["layout"] == "sequence"
    assert manifest["rows"] == 16  # 16 two-step trajectories, one sequence each
    assert_tokens_stored_once(bound.lake, landed, batch_id)
    return batch_id, rows


def _later_runs_read_only_new_versions(driver: Driver, bound, first_turns: int) -> Rollouts:
    """A re-run with nothing new reads an empty version range and duplicates nothing; after new
    turns, each asset reads only the new versions. Returns the rollouts landed later."""
    again = driver.refresh()
    assert again["steps"]["read_versions"]["turns"] == [first_turns, first_turns]
    assert again["curated_steps"]["dagster/row_count"] == 40

    landed_later = land_rollouts(bound.lake, groups=3, group_size=4, steps=2, seed=1)
    later = driver.refresh()
    assert later["steps"]["read_versions"]["turns"] == [first_turns, first_turns + 1]
    assert later["steps"]["rows_read"]["turns"] == later["steps"]["rows_written"] == 24
    for key in CHAIN[2:]:
        assert later[key]["dagster/row_count"] == 64, key
    all_steps = bound.lake.scan("steps").collect()
    assert all_steps.height == all_steps.get_column("step_id").n_unique() == 64
    return landed_later


def _re_materialized_batch_is_the_same(
    driver: Driver, bound, batch_id: str, rows: pl.DataFrame
) -> None:
    """Re-materializing the first batch after more data landed reproduces it exactly; so does
    re-materializing it once the recipe was edited: the batch keeps the recipe it was planned
    under (here its credit assignment), new batches get the edit."""
    driver.materialize(["batch_grpo"], partition_key=batch_id)
    reproduced = _batch_rows(bound.lake, batch_id)
    assert reproduced.columns == rows.columns
    assert reproduced.equals(rows), "a re-materialized batch differs in some column"
    edited = recipes()["grpo"].model_copy(update={"credit_assignment": CreditAssignment()})
    dg.materialize(
        [build_batch_asset(edited)],
        instance=driver.instance,
        resources={"lake": bound.resource},
        partition_key=batch_id,
    )
    under_edit = _batch_rows(bound.lake, batch_id)
    assert under_edit.equals(rows), "a batch re-materialized under an edited recipe changed"


def _second_batch_takes_the_groups_left(
    driver: Driver, bound, landed: Rollouts, first_rows: pl.DataFrame
) -> None:
    """The 4 groups left over make the second batch, with none of the first batch's steps."""
    (second,) = driver.tick("batch_grpo_planner").run_requests
    driver.materialize(["batch_grpo"], partition_key=second.partition_key)
    second_rows = _batch_rows(bound.lake, second.partition_key)
    assert_batch_matches(second_rows, landed, group_size=4)
    assert not set(second_rows["turn_id"]) & set(first_rows["turn_id"])
    consumed = bound.lake.scan("batch_ledger/grpo").collect()
    assert consumed.height == consumed.get_column("turn_id").n_unique() == 64
    assert isinstance(driver.tick("batch_grpo_planner"), dg.SkipReason)


def _other_recipes_batch_the_same_steps(driver: Driver) -> None:
    """The other shipped recipes batch the same steps independently, in their own formats."""
    for recipe in ("dpo", "sft"):
        (request, *_) = driver.tick(f"batch_{recipe}_planner").run_requests
        result = driver.materialize(
            [f"batch_{recipe}", f"export_{recipe}"], partition_key=request.partition_key
        )
        assert driver.metadata(result, f"batch_{recipe}")["dagster/partition_row_count"] > 0
        manifest = driver.metadata(result, f"export_{recipe}")["manifest"]
        assert manifest["algorithm"] == recipe and manifest["files"]
        assert manifest["planned_with"]["recipe"]["name"] == recipe


def test_an_export_whose_write_failed_is_retried_in_its_run(
    driver: Driver, bound, monkeypatch
) -> None:
    """Nothing else would export a batch its own run built, so a failed write is retried."""
    from claw_pipelines.batching import release as batch_release

    export_chunks, failures = batch_release.export_chunks, []

    def fails_once(*args, **kwargs):
        if not failures:
            failures.append(OSError("connection reset by the object store"))
            raise failures[0]
        return export_chunks(*args, **kwargs)

    monkeypatch.setattr(batch_release, "export_chunks", fails_once)
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


def test_tables_an_earlier_version_wrote_keep_working(driver: Driver, bound) -> None:
    """A lake whose steps and batch tables an earlier version wrote (token lists and messages
    copied into them, no ``request_tools``, no token signals): the next steps run merges the
    new columns in, even with nothing new, and the schema checks accept the legacy ones; batch
    rows and their TRL export carry the tools, read from ``turns``."""
    legacy = {"steps": EXTRACTED_STEPS, "batches/grpo": BATCH_ROWS}
    for table, schema in legacy.items():
        bound.lake.ensure(table, pa.schema([f for f in schema if f.name != "request_tools"]))
    driver.materialize(["steps"])  # every check passes
    assert set(SIGNAL_COLUMNS) <= set(bound.lake.scan("steps").collect_schema().names())
    tools = json.dumps([{"type": "function", "function": {"name": "calc"}}])
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1, request_tools=tools)
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    driver.materialize(["batch_grpo", "export_grpo"], partition_key=request.partition_key)
    rows = batch_rows(bound.lake, "grpo", "grpo", request.partition_key)
    assert set(rows["request_tools"]) == {tools}
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


def test_unique_step_ids_checks_the_new_ids_against_the_whole_table() -> None:
    table = pl.LazyFrame({"step_id": ["s-1", "s-2", "s-2", "s-3"]})
    assert unique_step_ids(table, pl.Series(["s-3"])).passed
    failed = unique_step_ids(table, pl.Series(["s-2", "s-3"]))
    assert not failed.passed
    assert failed.metadata["duplicated_step_ids"].value == ["s-2"]
