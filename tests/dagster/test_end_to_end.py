"""Real traffic: openai SDK agents through the LiteLLM proxy and the embedded engine, then the
assets in-process over the lake the proxy wrote, to a GRPO batch."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
from dagster_harness import Bound, Driver

from claw_pipelines.batches.rows import batch_rows
from claw_pipelines.demo import AGENT, reward, run_demo
from claw_pipelines.schemas import utc_now
from resources.lake import LakeResource

PROMPTS = 8
MAX_ROUNDS = 6
"""Rounds of ``PROMPTS`` groups of 4 rollouts, until 4 groups have mixed rewards (a grpo batch
drops zero-variance groups); how many a round yields depends on the simulated policy."""


def test_demo_agents_to_grpo_batch(capture_stack, instance) -> None:
    started = utc_now()
    turns_played, mixed = 0, 0
    for _ in range(MAX_ROUNDS):
        summary = run_demo(
            prompts=PROMPTS,
            rollouts=4,
            proxy_url=capture_stack.proxy_url,
            concurrency=8,
            key=capture_stack.key,
            lake=capture_stack.lake,
        )
        assert summary.errors == 0
        turns_played += summary.turns
        mixed += summary.mixed_groups
        if mixed >= 4:
            break
    assert mixed >= 4, f"only {mixed} groups with mixed rewards in {MAX_ROUNDS} rounds"

    def mine(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.filter((pl.col("agent") == AGENT) & (pl.col("started_at") >= started))

    turns = mine(capture_stack.wait_for_rows(lambda f: mine(f).height >= turns_played))
    assert turns.height == turns_played
    trajectories = set(turns["trajectory_id"])
    capture_stack.wait_for_rows(
        lambda f: trajectories <= set(f["trajectory_id"]), table="trajectory_events"
    )

    driver = Driver(Bound.over(LakeResource(lake_uri=capture_stack.lake.root)), instance)
    driver.refresh()
    planned = driver.tick("batch_grpo_planner")
    assert isinstance(planned, dg.SensorResult), planned
    batch_ids = [request.partition_key for request in planned.run_requests]
    for batch_id in batch_ids:  # the shared lake may hold other areas' ready groups too
        driver.materialize(["batch_grpo"], partition_key=batch_id)
    rows = pl.concat(batch_rows(capture_stack.lake, "grpo", "grpo", b) for b in batch_ids)

    landed = capture_stack.rows("turns").select("turn_id", "prompt_token_ids", "response_token_ids")
    joined = rows.join(landed, on="turn_id", suffix="_landed")
    assert joined.height == rows.height
    assert joined["prompt_token_ids"].to_list() == joined["prompt_token_ids_landed"].to_list()
    assert joined["response_token_ids"].to_list() == joined["response_token_ids_landed"].to_list()
    sent = {tuple(a["token_ids"]) for a in capture_stack.engine_answers().values()}
    assert all(tuple(ids) in sent for ids in rows["response_token_ids"].to_list())

    ours = rows.filter(pl.col("trajectory_id").is_in(list(trajectories)))
    sizes = ours.group_by("group_id").agg(pl.col("trajectory_id").n_unique().alias("n"))
    assert sizes.height >= 1 and set(sizes["n"]) == {4}
    for row in ours.filter(pl.col("is_last")).iter_rows(named=True):
        truth = json.loads(row["metadata"])["claw"]["ground_truth"]
        content = json.loads(row["response_message"])["content"]
        assert row["outcome_reward"] == reward(content, int(truth)), row["trajectory_id"]
    rewards = ours.group_by("group_id").agg(pl.col("outcome_reward").n_unique().alias("values"))
    assert set(rewards["values"]) == {2}  # zero-variance groups were filtered out
