"""A black-box agent written only from Claw-R1's documented gateway protocol, as its users write
them: nothing of ours, only the gateway's routes and bodies.

Its flow is Claw-R1's ``BlackBoxAgentFlowBase``: ``POST /init_trajectory``, swap the prompt uid
into the ``base_url`` it returns, ``register_trajectory`` with the dataset row's metadata (a verl
row: ``data_source``, ``reward_model.ground_truth``), run the agent, ``complete_trajectory``. The
agent is its GSM8K agent's shape: the ``openai`` SDK with ``api_key="not-needed"`` and model
``default``, tool calls parsed from ``<tool_call>`` tags in ``content``, and the assistant text
sent back as it came, tool results as ``{"role": "tool", "content": ...}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import httpx
import openai

from claw_pipelines.engine.tasks import Task, evaluate

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
LAST_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
DATA_SOURCE = "arith"
MAX_TURNS = 4


def parse_tool_calls(content: str) -> list[dict]:
    """The ``{"name", "arguments"}`` objects in ``<tool_call>`` tags (as Hermes parsers read)."""
    calls = []
    for match in TOOL_CALL.findall(content):
        try:
            parsed = json.loads(match)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict) and "name" in parsed and "arguments" in parsed:
            calls.append(parsed)
    return calls


def verdict(final: str, ground_truth: str) -> float:
    """1.0 when the last number of the final answer is the ground truth."""
    numbers = LAST_NUMBER.findall(final)
    return float(bool(numbers) and float(numbers[-1].replace(",", "")) == float(ground_truth))


@dataclass
class Turn:
    turn_id: str
    response_id: str
    content: str


@dataclass
class Rollout:
    trajectory_uid: str
    prompt_uid: str
    ground_truth: str
    reward_sent: bool
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0


def _begin(gateway: str, prompt_uid: str, ground_truth: str) -> tuple[str, str]:
    """init_trajectory, then register it; returns (trajectory uid, base_url)."""
    with httpx.Client(timeout=60) as http:
        init = http.post(f"{gateway}/init_trajectory").raise_for_status().json()
        prefix = init["base_url"].rsplit("/", 2)[0]
        base_url = f"{prefix}/{prompt_uid}/v1"
        metadata = {
            "data_source": DATA_SOURCE,
            "reward_model": {"ground_truth": ground_truth, "style": "rule"},
            "uid": prompt_uid,
        }
        body = {"channel": "train", "metadata": metadata}
        http.post(f"{base_url}/register_trajectory", json=body).raise_for_status()
    return init["trajectory_uid"], base_url


def run_rollout(gateway: str, prompt_uid: str, task: Task, *, send_reward: bool) -> Rollout:
    """One rollout of ``task``; ``send_reward``: complete with ``{"reward", "channel"}`` (the
    agent's own verdict), else with no body, leaving the reward to the rule reward."""
    ground_truth = str(task.answer)
    trajectory_uid, base_url = _begin(gateway, prompt_uid, ground_truth)
    rollout = Rollout(trajectory_uid, prompt_uid, ground_truth, send_reward)
    client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=60)
    messages: list[dict] = [{"role": "user", "content": task.question}]
    for _ in range(MAX_TURNS):
        raw = client.chat.completions.with_raw_response.create(
            model="default", messages=messages, tools=[CALCULATOR]
        )
        completion = raw.parse()
        content = completion.choices[0].message.content or ""
        rollout.turns.append(Turn(raw.headers["x-litellm-call-id"], completion.id, content))
        messages.append({"role": "assistant", "content": content})
        calls = parse_tool_calls(content)
        if not calls:
            break
        for call in calls:
            result = str(evaluate(str(call["arguments"].get("expression", ""))))
            messages.append({"role": "tool", "content": result})
    rollout.reward = verdict(rollout.turns[-1].content, ground_truth)
    with httpx.Client(timeout=60) as http:
        body = {"reward": rollout.reward, "channel": "train"} if send_reward else None
        http.post(f"{base_url}/complete_trajectory", json=body).raise_for_status()
    return rollout
