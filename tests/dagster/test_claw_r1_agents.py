"""Claw-R1 black-box agents, unchanged, through the real proxy (``--compat claw-r1``) and the
embedded engine, then the assets in-process over the lake the proxy wrote, to a GRPO batch."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest
from claw_r1_agent import Rollout, run_rollout
from dagster_harness import Bound, Driver
from stack_fixtures import CaptureStack

from claw_pipelines.engine.tasks import generate_tasks
from claw_pipelines.engine.tokenizer import IM_END_ID, decode
from claw_pipelines.schemas import new_id
from resources.lake import LakeResource

PROMPTS = 8
ROLLOUTS = 4
MAX_ROUNDS = 4
"""Rounds of ``PROMPTS`` prompts of ``ROLLOUTS`` rollouts, until 4 groups have mixed rewards (a
grpo batch drops zero-variance groups); how many a round yields depends on the simulated policy."""


def _play(stack: CaptureStack) -> list[Rollout]:
    """Rollouts of each prompt (one prompt uid each); half complete with the agent's reward,
    half with no body (the rule reward then scores them from the registered ground truth)."""
    rollouts: list[Rollout] = []
    mixed = 0
    for round_index in range(MAX_ROUNDS):
        for task in generate_tasks(PROMPTS, seed=1000 + round_index):
            prompt_uid = f"prompt-{new_id()}"
            group = [
                run_rollout(stack.proxy_url, prompt_uid, task, send_reward=member % 2 == 0)
                for member in range(ROLLOUTS)
            ]
            rollouts += group
            mixed += len({rollout.reward for rollout in group}) == 2
        if mixed >= 4:
            return rollouts
    raise AssertionError(f"only {mixed} groups with mixed rewards in {MAX_ROUNDS} rounds")


def _generated_text(token_ids: list[int]) -> str:
    """What the engine generated, as text (its end-of-turn token is no text)."""
    return decode(token_ids[:-1] if token_ids[-1] == IM_END_ID else token_ids)


def _assert_turns_are_engine_exact(stack: CaptureStack, rollouts: list[Rollout]) -> None:
    played = {turn.turn_id: (rollout, turn) for rollout in rollouts for turn in rollout.turns}
    rows = stack.wait_for_rows(lambda df: set(played) <= set(df["turn_id"]))
    rows = rows.filter(pl.col("turn_id").is_in(list(played)))
    assert rows.height == len(played)
    answers = stack.engine_answers()
    tool_turns = 0
    for row in rows.iter_rows(named=True):
        rollout, turn = played[row["turn_id"]]
        sent = answers[turn.response_id]
        assert (row["trajectory_id"], row["group_id"]) == (
            rollout.trajectory_uid,
            rollout.prompt_uid,
        )
        assert row["channel"] == "train" and row["token_source"] == "engine"
        assert row["prompt_token_ids"] == sent["prompt_token_ids"]
        assert row["response_token_ids"] == sent["token_ids"]
        assert row["response_logprobs"] == pytest.approx(sent["logprobs"], rel=1e-6)
        assert turn.content == _generated_text(sent["token_ids"])  # the raw text, tags and all
        if "<tool_call>" in turn.content:
            tool_turns += 1
            assert row["finish_reason"] == "tool_calls"
            (call,) = json.loads(row["response_message"])["tool_calls"]
            assert call["function"]["name"] == "calculator"
    assert tool_turns > 0, "the simulated policy never called the calculator"


def test_claw_r1_agents_land_engine_exact_and_form_a_grpo_batch(
    claw_r1_stack: CaptureStack, instance: dg.DagsterInstance
) -> None:
    rollouts = _play(claw_r1_stack)
    _assert_turns_are_engine_exact(claw_r1_stack, rollouts)
    ours = {rollout.trajectory_uid: rollout for rollout in rollouts}
    claw_r1_stack.wait_for_rows(
        lambda df: set(ours) <= set(df["trajectory_id"]), table="trajectory_events"
    )
    registered = claw_r1_stack.rows("trajectory_registrations")
    assert set(ours) <= set(registered["trajectory_id"])

    driver = Driver(Bound.over(LakeResource(lake_uri=claw_r1_stack.lake.root)), instance)
    driver.refresh()
    lake = claw_r1_stack.lake
    steps = lake.scan("steps").filter(pl.col("trajectory_id").is_in(list(ours))).collect()
    assert set(steps["trajectory_id"]) == set(ours)
    assert steps["prefix_consistent"].all()  # the text sent back renders to the engine's tokens
    outcomes = lake.scan("rewarded_steps").filter(pl.col("is_last")).collect()
    for row in outcomes.filter(pl.col("trajectory_id").is_in(list(ours))).iter_rows(named=True):
        rollout = ours[row["trajectory_id"]]
        assert row["group_id"] == rollout.prompt_uid
        assert row["outcome_reward"] == rollout.reward, row["trajectory_id"]
        assert row["reward_sources"] == ["env" if rollout.reward_sent else "rule"]

    planned = driver.tick("batch_grpo_planner")
    assert isinstance(planned, dg.SensorResult), planned
    batch_ids = [request.partition_key for request in planned.run_requests]
    for batch_id in batch_ids:
        driver.materialize(["batch_grpo"], partition_key=batch_id)
    batch = lake.scan("batches/grpo").filter(pl.col("batch_id").is_in(batch_ids)).collect()
    mine = batch.filter(pl.col("trajectory_id").is_in(list(ours)))
    assert mine.height > 0
    sizes = mine.group_by("group_id").agg(pl.col("trajectory_id").n_unique().alias("n"))
    assert set(sizes["n"]) == {ROLLOUTS}
    assert set(sizes["group_id"]) <= {rollout.prompt_uid for rollout in rollouts}
