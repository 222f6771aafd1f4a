"""The landing rows of Claw-R1's lifecycle and white-box calls: the rows our own endpoints land.

A registration is a ``trajectory_registrations`` row (the rule rewards read its ground truth
whenever it lands); a completion a ``trajectory_events`` row; a submitted step a white-box
``turns`` row (``/claw/v1/steps``), with its reward as a turn-targeted ``rewards`` row and, when
it is the last, the trajectory's completion.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.capture.turns import scrubbed_json
from claw_pipelines.edge.claw_r1.protocol import (
    CompleteTrajectory,
    RegisterTrajectory,
    StepPayload,
    declared_task,
)
from claw_pipelines.edge.control import StepIn, white_box_turn
from claw_pipelines.identity import TurnIdentity
from claw_pipelines.schemas import LandingRow, Reward, TrajectoryEventRow, TrajectoryRegistration

WHITE_BOX_MODEL = "white-box"


def registration_row(
    runtime: CaptureRuntime, trajectory: str, group: str, body: RegisterTrajectory
) -> TrajectoryRegistration:
    truth, source = declared_task(body.metadata)
    return TrajectoryRegistration(
        trajectory_id=trajectory,
        group_id=group,
        channel=body.channel,
        ground_truth=runtime.redactor.text(truth) if truth is not None else None,
        data_source=source,
        metadata=scrubbed_json(body.metadata, runtime.redactor),
    )


def completion_row(
    trajectory: str, group: str, body: CompleteTrajectory | None, channel: str
) -> TrajectoryEventRow:
    """``channel``: the body's, else the one the trajectory was registered with."""
    return TrajectoryEventRow(
        trajectory_id=trajectory,
        group_id=group,
        event="completed",
        reward=body.reward if body else None,
        metadata=json.dumps({"channel": channel}, ensure_ascii=False),
    )


def _step_metadata(step: StepPayload) -> dict[str, Any]:
    """The step's metadata with ``claw`` holding its declared place and, as for a call's
    ``metadata.claw``, the ground truth and data source the rule rewards read."""
    metadata = dict(step.metadata or {})
    truth, source = declared_task(metadata)
    declared = {"ground_truth": truth, "data_source": source}
    claw = {k: v for k, v in declared.items() if v is not None} | (metadata.get("claw") or {})
    claw |= {"step_index": step.step_index, "is_last": step.is_last}
    return {**metadata, "claw": claw}


def _white_box(runtime: CaptureRuntime, step: StepPayload, channel: str, at: datetime):
    identity = TurnIdentity(
        trajectory_id=step.trajectory_uid or None,
        group_id=step.prompt_uid or None,
        channel=channel,
        policy_version=step.policy_version,
    )
    body = StepIn(
        prompt_token_ids=step.prompt_ids,
        response_token_ids=step.response_ids,
        response_logprobs=step.rollout_log_probs,
        model=WHITE_BOX_MODEL,
        metadata=_step_metadata(step),
    )
    return white_box_turn(runtime, body, identity, at)


def step_rows(
    runtime: CaptureRuntime, steps: list[StepPayload], channel: str, at: datetime
) -> list[LandingRow]:
    """Every row of one ``submit_steps`` call.

    Steps are ordered by (started_at, turn_id) downstream; one call's steps get timestamps a
    microsecond apart in (trajectory, step_index) order, so they keep the order they declare.
    """
    order = sorted(range(len(steps)), key=lambda i: (steps[i].trajectory_uid, steps[i].step_index))
    rows: list[LandingRow] = []
    for rank, index in enumerate(order):
        step = steps[index]
        turn = _white_box(runtime, step, channel, at + timedelta(microseconds=rank))
        rows.append(turn)
        if step.reward is not None:
            rows.append(Reward(turn_id=turn.turn_id, value=step.reward, source="env"))
        if step.is_last and step.trajectory_uid:
            rows.append(
                TrajectoryEventRow(
                    trajectory_id=step.trajectory_uid, group_id=step.prompt_uid or None
                )
            )
    return rows
