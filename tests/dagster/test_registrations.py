"""A trajectory's registration (Claw-R1's ``register_trajectory``) reaches the rule rewards of
every turn of it, also when it lands after the turns were stepped and rewarded."""

from __future__ import annotations

import json
from datetime import timedelta

import polars as pl
from dagster_harness import Bound, Driver

from claw_pipelines.schemas import (
    TrajectoryEventRow,
    TrajectoryRegistration,
    Turn,
    new_id,
    rows_to_arrow,
    utc_now,
)

ANSWERS = {"right": "17 + 25 = 42. The answer is 42.", "wrong": "17 + 25 = 41. The answer is 41."}


def _turns(group: str) -> list[dict]:
    """Two steps per trajectory, without ground truth in their metadata (Claw-R1 agents send
    none with their calls)."""
    rows, start = [], utc_now()
    for n, (trajectory, answer) in enumerate(ANSWERS.items()):
        prompt = [1, 2, 3, 4]
        for index, text in enumerate(["<tool_call>…</tool_call>", answer]):
            began = start + timedelta(milliseconds=10 * n + index)
            response = [40 + index, 41 + n, 99]
            rows.append(
                Turn(
                    turn_id=new_id(),
                    trajectory_id=trajectory,
                    group_id=group,
                    model="policy",
                    token_source="engine",
                    finish_reason="stop",
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    response_logprobs=[-0.5] * len(response),
                    request_messages=json.dumps([{"role": "user", "content": "17 + 25?"}]),
                    response_message=json.dumps({"role": "assistant", "content": text}),
                    response_text=text,
                    started_at=began,
                    ended_at=began + timedelta(microseconds=500),
                ).model_dump()
            )
            prompt = [*prompt, *response, 7]
    return rows


def _outcomes(bound: Bound) -> dict[str, tuple]:
    rows = bound.lake.scan("rewarded_steps").filter(pl.col("is_last")).collect()
    return {
        row["trajectory_id"]: (row["outcome_reward"], row["reward_sources"])
        for row in rows.iter_rows(named=True)
    }


def test_a_late_registration_re_credits_its_trajectories(bound: Bound, instance) -> None:
    driver = Driver(bound, instance)
    group = f"g-{new_id()}"
    bound.lake.append("turns", rows_to_arrow(Turn, _turns(group)))
    events = [TrajectoryEventRow(trajectory_id=t, group_id=group).model_dump() for t in ANSWERS]
    bound.lake.append("trajectory_events", rows_to_arrow(TrajectoryEventRow, events))
    driver.refresh()
    assert _outcomes(bound) == {"right": (None, []), "wrong": (None, [])}

    registered = [
        TrajectoryRegistration(
            trajectory_id=t, group_id=group, channel="train", ground_truth="42", data_source="arith"
        ).model_dump()
        for t in ANSWERS
    ]
    bound.lake.append("trajectory_registrations", rows_to_arrow(TrajectoryRegistration, registered))
    metadata = driver.refresh()
    assert metadata["rewarded_steps"]["rows_written"] == 4
    assert _outcomes(bound) == {"right": (1.0, ["rule"]), "wrong": (0.0, ["rule"])}
