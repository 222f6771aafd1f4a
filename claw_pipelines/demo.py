"""``claw demo``: real agent traffic through the capture proxy, shaped like GRPO rollouts.

Each task is asked ``rollouts`` times (one group); each rollout is a tool-using agent written
against the plain ``openai`` SDK whose only integration is its ``base_url``
(``/t/<trajectory>/<group>/v1``), which is the zero-code-change path the proxy must support. The
agent runs the calculator locally, scores its final answer with a rule reward and reports the
trajectory as complete, so every stage of the pipeline gets data. With ``--long`` each task is a
long session instead (``demo_workspace``): a long system prompt and dozens of tool calls that
read a workspace, the shape of real CLI agents' sessions and of sequence batches.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import polars as pl
from deltalake.exceptions import DeltaError
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from claw_pipelines.batches.names import batches_table
from claw_pipelines.demo_trainer import CONSUMER, TrainerRun, play_trainer
from claw_pipelines.demo_workspace import (
    LONG_SYSTEM_TOKENS,
    TOOLS,
    WORKSPACE_FILES,
    Workspace,
    generate_workspaces,
    handbook,
)
from claw_pipelines.engine.tasks import Task, evaluate, generate_tasks, parse_final_answer
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import new_id
from claw_pipelines.settings import LOCAL_MASTER_KEY
from claw_pipelines.trainer import BatchConsumer, PolicyClient

MODEL = "policy"
AGENT = "demo-calculator"
DATA_SOURCE = "arith"
RECIPE = "grpo"
BATCH_TABLE = batches_table(RECIPE)
MAX_TURNS = 4
MAX_TOKENS = 192
MAX_ERRORS_SHOWN = 5
SYSTEM_PROMPT = (
    "You are a careful math assistant. Use the calculator tool when it helps, "
    "and end with 'The answer is N.'"
)
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


LONG_AGENT = "demo-long-session"
LONG_DATA_SOURCE = "workspace"
LONG_MAX_TURNS = 80
"""Above the engine's own bound on tool calls in one user turn (64)."""


@dataclass(frozen=True)
class Agent:
    """What the agent is given for a task: its name, prompt, tools and how it runs them."""

    name: str
    data_source: str
    system: str
    tools: list[dict[str, Any]]
    run_tool: Callable[[str, str], str]
    """A tool's answer from its name and JSON arguments."""
    max_turns: int


def calculator(arguments: str) -> str:
    """Run one calculator call from its JSON arguments; failures become the tool's answer."""
    try:
        return str(evaluate(str(json.loads(arguments)["expression"])))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


CALCULATOR_AGENT = Agent(
    AGENT,
    DATA_SOURCE,
    SYSTEM_PROMPT,
    [CALCULATOR_TOOL],
    lambda _, arguments: calculator(arguments),
    MAX_TURNS,
)


@dataclass(frozen=True)
class LongSessions:
    """``--long``: each task a workspace of ``files`` files read under a system prompt of about
    ``system_tokens`` tokens."""

    files: int = WORKSPACE_FILES
    system_tokens: int = LONG_SYSTEM_TOKENS

    def tasks(self, count: int, seed: int) -> list[Workspace]:
        return generate_workspaces(count, seed, self.files)

    def agent(self, workspace: Workspace, system: str) -> Agent:
        return Agent(
            LONG_AGENT, LONG_DATA_SOURCE, system, TOOLS, workspace.run_tool, LONG_MAX_TURNS
        )


def reward(final_text: str | None, ground_truth: int) -> float:
    """The rule reward: 1.0 when the stated final answer is the ground truth, else 0.0."""
    return 1.0 if parse_final_answer(final_text) == ground_truth else 0.0


@dataclass(frozen=True)
class Rollout:
    """One trajectory to play: its task, its identity (group shared by the task's rollouts) and
    the agent that plays it."""

    task: Task | Workspace
    group_id: str
    trajectory_id: str
    agent: Agent = CALCULATOR_AGENT

    def claw_metadata(self) -> dict[str, str]:
        return {
            "ground_truth": str(self.task.answer),
            "data_source": self.agent.data_source,
            "task_id": self.task.task_id,
            "agent": self.agent.name,
        }


def plan_rollouts(
    tasks: Sequence[Task | Workspace],
    rollouts: int,
    make_id: Callable[[], str] = new_id,
    agent_of: Callable[[Task | Workspace], Agent] = lambda _: CALCULATOR_AGENT,
) -> list[Rollout]:
    """``rollouts`` trajectories per task, one group per task, played by ``agent_of(task)``."""
    plan = []
    for task in tasks:
        group_id, agent = make_id(), agent_of(task)
        plan.extend(Rollout(task, group_id, make_id(), agent) for _ in range(rollouts))
    return plan


def plan_round(prompts: int, rollouts: int, long: LongSessions | None) -> list[Rollout]:
    """One round of rollouts on fresh tasks: arithmetic, or long-session workspaces."""
    seed = secrets.randbits(31)
    if long is None:
        return plan_rollouts(generate_tasks(prompts, seed=seed), rollouts)
    system = handbook(long.system_tokens)
    return plan_rollouts(
        long.tasks(prompts, seed), rollouts, agent_of=lambda task: long.agent(task, system)
    )


@dataclass(frozen=True)
class Episode:
    """What the agent did: how many LLM turns it took and the text it ended with."""

    turns: int
    final_text: str | None


@dataclass(frozen=True)
class Outcome:
    rollout: Rollout
    turns: int
    reward: float | None
    error: str | None = None


def assistant_message(message: ChatCompletionMessage) -> dict[str, Any]:
    """The assistant turn as the agent sends it back (content and tool calls unchanged)."""
    turn: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        turn["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
            if isinstance(call, ChatCompletionMessageFunctionToolCall)
        ]
    return turn


def tool_results(message: ChatCompletionMessage, agent: Agent) -> list[dict[str, Any]]:
    return [
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": agent.run_tool(call.function.name, call.function.arguments),
        }
        for call in message.tool_calls or []
        if isinstance(call, ChatCompletionMessageFunctionToolCall)
    ]


async def play(
    client: AsyncOpenAI,
    task: Task | Workspace,
    extra_body: dict[str, Any],
    agent: Agent = CALCULATOR_AGENT,
) -> Episode:
    """The agent loop: ask, run the tools the model calls, stop at a plain answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": agent.system},
        {"role": "user", "content": task.question},
    ]
    for turn in range(1, agent.max_turns + 1):
        response = await client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            tools=agent.tools,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            extra_body=extra_body,
        )
        message = response.choices[0].message
        messages.append(assistant_message(message))
        if not message.tool_calls:
            return Episode(turn, message.content)
        messages.extend(tool_results(message, agent))
    return Episode(agent.max_turns, None)


async def run_rollout(
    client: AsyncOpenAI, http: httpx.AsyncClient, proxy_url: str, rollout: Rollout
) -> Outcome:
    """Play one rollout through the proxy and report it complete (or aborted) with its reward."""
    agent = client.with_options(
        base_url=f"{proxy_url}/t/{rollout.trajectory_id}/{rollout.group_id}/v1"
    )
    extra_body = {"metadata": {"claw": rollout.claw_metadata()}}
    try:
        episode = await play(agent, rollout.task, extra_body, rollout.agent)
    except Exception as exc:  # counted and reported; one failed rollout must not stop the demo
        await _complete(http, proxy_url, rollout, None, "aborted")
        return Outcome(rollout, 0, None, f"{type(exc).__name__}: {exc}")
    value = reward(episode.final_text, rollout.task.answer)
    error = await _complete(http, proxy_url, rollout, value, "completed")
    return Outcome(rollout, episode.turns, value, error)


async def _complete(
    http: httpx.AsyncClient, proxy_url: str, rollout: Rollout, value: float | None, status: str
) -> str | None:
    """POST the trajectory's end; returns an error description instead of raising."""
    url = f"{proxy_url}/claw/v1/trajectories/{rollout.trajectory_id}/complete"
    body = {"reward": value, "status": status, "group_id": rollout.group_id}
    try:
        response = await http.post(url, json=body)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return f"complete failed: {type(exc).__name__}: {exc}"
    return None


@dataclass(frozen=True)
class Summary:
    trajectories: int
    errors: int
    turns: int
    rewards: list[float]
    mixed_groups: int
    groups: int
    batches: int | None
    trainer: TrainerRun | None = None

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


def summarize(
    outcomes: Sequence[Outcome], batches: int | None, trainer: TrainerRun | None = None
) -> Summary:
    """Counts for the final table; a group is "mixed" when its rewards differ (GRPO signal)."""
    rewards = [o.reward for o in outcomes if o.reward is not None]
    by_group: dict[str, set[float]] = {}
    for outcome in outcomes:
        if outcome.reward is not None:
            by_group.setdefault(outcome.rollout.group_id, set()).add(outcome.reward)
    return Summary(
        trajectories=len(outcomes),
        errors=sum(o.error is not None for o in outcomes),
        turns=sum(o.turns for o in outcomes),
        rewards=rewards,
        mixed_groups=sum(len(values) > 1 for values in by_group.values()),
        groups=len({o.rollout.group_id for o in outcomes}),
        batches=batches,
        trainer=trainer,
    )


def count_batches(lake: Lake, table: str = BATCH_TABLE) -> int | None:
    """Distinct batches materialized so far; None when the table cannot be read (yet)."""
    try:
        frame = lake.scan(table)
        if frame is None:
            return None
        return frame.select(pl.col("batch_id").n_unique()).collect().item()
    except (pl.exceptions.PolarsError, DeltaError, OSError):
        return None


def summary_table(summary: Summary) -> Table:
    table = Table(title="claw demo")
    table.add_column("what")
    table.add_column("value", justify="right")
    ok = summary.trajectories - summary.errors
    table.add_row("trajectories", f"{ok} ok / {summary.errors} with errors")
    mean_turns = summary.turns / summary.trajectories if summary.trajectories else 0.0
    table.add_row("turns (LLM calls)", f"{summary.turns} ({mean_turns:.2f} per trajectory)")
    mean = summary.mean_reward
    table.add_row("mean reward", "n/a" if mean is None else f"{mean:.3f}")
    counts = Counter(summary.rewards)
    distribution = ", ".join(f"{value:.1f} x {counts[value]}" for value in sorted(counts))
    table.add_row("reward distribution", distribution or "n/a")
    table.add_row("groups with mixed rewards", f"{summary.mixed_groups} / {summary.groups}")
    batches = summary.batches
    table.add_row(f"batches ({BATCH_TABLE})", "not yet" if not batches else str(batches))
    if summary.trainer is not None:
        versions = [step.version for step in summary.trainer.steps]
        trained = f"{len(versions)} batches, policy versions {versions}" if versions else "none"
        table.add_row("trained on (online)", trained)
    return table


@dataclass(frozen=True)
class Online:
    """``--online``: batches the pretend trainer takes, its give-up time and step length."""

    steps: int
    timeout_s: float
    train_s: float


async def _run_online(
    prompts: int,
    rollouts: int,
    proxy_url: str,
    key: str,
    concurrency: int,
    console: Console,
    online: Online,
    lake: Lake,
    long: LongSessions | None,
) -> tuple[list[Outcome], TrainerRun]:
    """Rounds of rollouts back to back while the trainer thread takes batches."""
    stop = threading.Event()
    consumer = BatchConsumer(RECIPE, CONSUMER, lake.root_uri, storage_options=lake.storage_options)
    with PolicyClient(proxy_url, key) as policy:
        trainer = asyncio.create_task(
            asyncio.to_thread(
                play_trainer, consumer, policy, online.steps, online.timeout_s, online.train_s, stop
            )
        )
        outcomes: list[Outcome] = []
        try:
            while not trainer.done():
                plan = plan_round(prompts, rollouts, long)
                outcomes += await _run_all(plan, proxy_url, key, concurrency, console)
        finally:
            stop.set()
        return outcomes, await trainer


async def _run_all(
    plan: Sequence[Rollout], proxy_url: str, key: str, concurrency: int, console: Console
) -> list[Outcome]:
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key=key, max_retries=0, timeout=120) as client,
        httpx.AsyncClient(headers=headers, timeout=30) as http,
    ):
        with Progress(console=console) as progress:
            bar = progress.add_task("rollouts", total=len(plan))

            async def one(rollout: Rollout) -> Outcome:
                async with gate:
                    outcome = await run_rollout(client, http, proxy_url, rollout)
                progress.advance(bar)
                return outcome

            return await asyncio.gather(*(one(rollout) for rollout in plan))


def run_demo(
    prompts: int,
    rollouts: int,
    proxy_url: str,
    concurrency: int,
    key: str | None = None,
    lake: Lake | None = None,
    online: Online | None = None,
    long: LongSessions | None = None,
) -> Summary:
    """Play ``prompts`` x ``rollouts`` trajectories through the proxy and print a summary; with
    ``online``, rounds of them until the pretend trainer is done; with ``long``, long sessions.

    ``key`` defaults to LITELLM_MASTER_KEY (else the local key), ``lake`` to the configured one.
    """
    console = Console()
    key = key or os.environ.get("LITELLM_MASTER_KEY", LOCAL_MASTER_KEY)
    lake = lake or Lake.from_settings()
    proxy_url, concurrency = proxy_url.rstrip("/"), max(1, concurrency)
    trainer = None
    if online is None:
        plan = plan_round(prompts, rollouts, long)
        outcomes = asyncio.run(_run_all(plan, proxy_url, key, concurrency, console))
    else:
        outcomes, trainer = asyncio.run(
            _run_online(prompts, rollouts, proxy_url, key, concurrency, console, online, lake, long)
        )
    errors = Counter(outcome.error for outcome in outcomes if outcome.error)
    for error, count in errors.most_common(MAX_ERRORS_SHOWN):
        console.print(f"[red]{count} x[/red] {error}")
    summary = summarize(outcomes, count_batches(lake), trainer)
    console.print(summary_table(summary))
    return summary
