"""Realistic landing rows for the inspector tests: tool-using arithmetic rollouts in groups.

Rows go through the real landing models (Turn, Reward, TrajectoryEventRow) and ``Lake.append``,
and token IDs come from the embedded engine's tokenizer with a ChatML layout, so each step's
prompt extends the previous prompt + response exactly, as the engine's would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from claw_pipelines.engine import tokenizer
from claw_pipelines.engine.server import MODEL_NAME as EMBEDDED_MODEL
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import Reward, TrajectoryEventRow, Turn, new_id, rows_to_arrow

SYSTEM = "You are a helpful assistant. Use the calculator tool."


def _chatml(role: str, text: str) -> list[int]:
    return tokenizer.encode(f"{tokenizer.IM_START}{role}\n{text}{tokenizer.IM_END}\n")


def _logprobs(ids: list[int], seed: int) -> list[float]:
    return [-((i * 37 + seed * 11) % 23) / 7.0 for i in range(len(ids))]


@dataclass
class Rollouts:
    """What a call to ``land_rollouts`` wrote, for assertions."""

    trajectories: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    open_trajectories: list[str] = field(default_factory=list)


def rollout_turns(
    trajectory_id: str,
    group_id: str,
    a: int,
    b: int,
    answer: int,
    *,
    start: datetime,
    policy_version: int,
    channel: str,
    agent: str,
    seed: int,
    steps: int = 2,
) -> list[Turn]:
    """One rollout: a calculator tool call, then the final answer (``steps`` = 1 skips the tool)."""
    question = f"What is {a} + {b}? Answer with 'The answer is N'."
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    prompt = _chatml("system", SYSTEM) + _chatml("user", question)
    generation = tokenizer.encode(f"{tokenizer.IM_START}assistant\n")
    turns = []
    for index in range(steps):
        last = index == steps - 1
        if last:
            text = f"The answer is {answer}"
            message = {"role": "assistant", "content": text}
        else:
            arguments = json.dumps({"expression": f"{a} + {b}"})
            text = f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{index}",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": arguments},
                    }
                ],
            }
        response = [*tokenizer.encode(text), tokenizer.IM_END_ID]
        began = start + timedelta(seconds=2 * index)
        turns.append(
            Turn(
                turn_id=new_id(),
                trajectory_id=trajectory_id,
                group_id=group_id,
                channel=channel,
                agent=agent,
                policy_version=policy_version,
                model=EMBEDDED_MODEL,  # the engine's served name, as the proxy records it
                backend="hosted_vllm:http://127.0.0.1:8001/v1",
                finish_reason="stop" if last else "tool_calls",
                token_source="engine",
                prompt_token_ids=prompt + generation,
                response_token_ids=response,
                response_logprobs=_logprobs(response, seed + index),
                request_messages=json.dumps(messages),
                request_tools=json.dumps(
                    [{"type": "function", "function": {"name": "calculator"}}]
                ),
                sampling_params=json.dumps({"temperature": 1.0, "max_tokens": 256}),
                response_message=json.dumps(message),
                response_text=text if last else None,
                prompt_tokens=len(prompt) + len(generation),
                completion_tokens=len(response),
                started_at=began,
                ended_at=began + timedelta(milliseconds=350),
                latency_ms=350.0,
                metadata=json.dumps({"claw": {"ground_truth": str(a + b), "data_source": "arith"}}),
            )
        )
        prompt = prompt + generation + response + tokenizer.encode("\n")
        messages = [*messages, message]
        if not last:
            result = {"role": "tool", "tool_call_id": f"call_{index}", "content": str(a + b)}
            messages.append(result)
            prompt = prompt + _chatml("tool", str(a + b))
    return turns


def land_rollouts(
    lake: Lake,
    *,
    groups: int = 2,
    rollouts: int = 4,
    policy_version: int = 1,
    channel: str = "train",
    agent: str = "arith-agent",
    leave_open: int = 0,
    start: datetime | None = None,
) -> Rollouts:
    """Append ``groups`` x ``rollouts`` trajectories; all but ``leave_open`` get completed with a
    rule reward (1.0 when the answer is right: every other rollout answers wrong)."""
    start = start or datetime.now(UTC) - timedelta(seconds=20)
    out = Rollouts()
    turns: list[Turn] = []
    events: list[TrajectoryEventRow] = []
    rewards: list[Reward] = []
    for g in range(groups):
        group_id = f"grp-{new_id()[-12:]}"
        out.groups.append(group_id)
        a, b = 10 + 7 * g, 20 + 3 * g
        for r in range(rollouts):
            trajectory_id = new_id()
            answer = a + b if r % 2 == 0 else a + b + 1
            rollout = rollout_turns(
                trajectory_id,
                group_id,
                a,
                b,
                answer,
                start=start + timedelta(milliseconds=100 * (g * rollouts + r)),
                policy_version=policy_version,
                channel=channel,
                agent=agent,
                seed=g * rollouts + r,
            )
            turns.extend(rollout)
            out.trajectories.append(trajectory_id)
            out.turns.extend(t.turn_id for t in rollout)
            if len(out.trajectories) > groups * rollouts - leave_open:
                out.open_trajectories.append(trajectory_id)
                continue
            events.append(TrajectoryEventRow(trajectory_id=trajectory_id, group_id=group_id))
            rewards.append(
                Reward(
                    trajectory_id=trajectory_id,
                    value=1.0 if answer == a + b else 0.0,
                    name="exact_match",
                    source="rule",
                )
            )
    lake.append("turns", rows_to_arrow(Turn, [t.model_dump() for t in turns]))
    if events:
        lake.append(
            "trajectory_events",
            rows_to_arrow(TrajectoryEventRow, [e.model_dump() for e in events]),
        )
        lake.append("rewards", rows_to_arrow(Reward, [r.model_dump() for r in rewards]))
    return out
