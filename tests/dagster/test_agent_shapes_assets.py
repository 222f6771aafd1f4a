"""Real agents' sessions through the asset chain over Delta tables that predate
``parent_trajectory_id``: the tables gain the column, side trajectories reach every step table
and the trajectories table linked to their parent, and tail edits land as such."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pyarrow as pa
from agent_shapes import claude_code_session, trailing_context_session
from dagster_harness import CHAIN, Driver

from claw_pipelines.derived_schemas import STEPS, TRAJECTORIES
from claw_pipelines.schemas import TrajectoryEventRow, Turn, rows_to_arrow, utc_now


def _without_parent(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if f.name != "parent_trajectory_id"])


def test_side_trajectories_and_tail_edits_flow_through_tables_that_predate_the_column(
    driver: Driver, bound
) -> None:
    for table, schema in {"steps": STEPS, "trajectories": TRAJECTORIES}.items():
        bound.lake.ensure(table, _without_parent(schema))
    driver.materialize(["steps", "trajectories"])
    for table in ("steps", "trajectories"):
        assert "parent_trajectory_id" in bound.lake.scan(table).collect_schema().names()

    start = utc_now() - timedelta(minutes=10)
    session = claude_code_session("cc", "cc-1", start=start, group_id="g")
    rows = [*session["title"], *session["main"], *session["helper"],
            *trailing_context_session("oc", start=start, trajectory_id="oc-1")]  # fmt: skip
    bound.lake.append("turns", rows_to_arrow(Turn, [Turn(**r).model_dump() for r in rows]))
    events = [TrajectoryEventRow(trajectory_id=t, reward=1.0) for t in ("cc-1", "oc-1")]
    bound.lake.append(
        "trajectory_events", rows_to_arrow(TrajectoryEventRow, [e.model_dump() for e in events])
    )
    driver.refresh()

    expected = {
        "cc-1/side-cc-title": "cc-1",
        "cc-1/side-cc-helper-0": "cc-1",
        "cc-1": None,
        "oc-1": None,
    }
    for table in CHAIN:
        if table == "trajectories":
            continue
        links = bound.lake.scan(table).select("trajectory_id", "parent_trajectory_id").collect()
        assert dict(links.unique().iter_rows()) == expected, table
    summary = bound.lake.scan("trajectories").collect()
    assert dict(summary.select("trajectory_id", "parent_trajectory_id").iter_rows()) == expected
    assert dict(summary.select("trajectory_id", "num_steps").iter_rows()) == {
        "cc-1/side-cc-title": 1, "cc-1/side-cc-helper-0": 2, "cc-1": 2, "oc-1": 4}  # fmt: skip
    rewarded = bound.lake.scan("rewarded_steps").collect()
    outcome = dict(rewarded.group_by("trajectory_id").agg(pl.col("outcome_reward").max()).rows())
    assert outcome["cc-1"] == outcome["oc-1"] == 1.0
    assert outcome["cc-1/side-cc-title"] is None
    reasons = bound.lake.scan("steps").filter(pl.col("trajectory_id") == "oc-1").collect()
    assert reasons.sort("step_index")["prefix_break_reason"].to_list() == [
        None, "tail_edit", "tail_edit", "tail_edit"]  # fmt: skip
