"""The demo agent loop against the engine directly, and the whole demo through the proxy."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import polars as pl
from openai import AsyncOpenAI

from claw_pipelines.demo import (
    LONG_AGENT,
    MAX_TURNS,
    LongSessions,
    Rollout,
    play,
    reward,
    run_demo,
    run_rollout,
)
from claw_pipelines.demo_workspace import handbook
from claw_pipelines.engine.tasks import generate_tasks
from claw_pipelines.processes import Service, free_port
from claw_pipelines.schemas import utc_now
from claw_pipelines.transforms import extract_steps
from claw_pipelines.transforms.sequences import sequence_rows


def test_agent_loop_against_the_engine(sim: Service) -> None:
    async def episodes():
        async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="none", max_retries=0) as client:
            tasks = generate_tasks(16, seed=9)
            body = {"return_token_ids": True, "metadata": {"claw": {"ground_truth": "1"}}}
            return tasks, await asyncio.gather(*(play(client, task, body) for task in tasks))

    tasks, results = asyncio.run(episodes())
    assert all(1 <= episode.turns <= MAX_TURNS for episode in results)
    assert any(episode.turns == 2 for episode in results)
    rewards = [reward(e.final_text, t.answer) for t, e in zip(tasks, results, strict=True)]
    assert 1.0 in rewards


def test_rollout_errors_are_reported_not_raised() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    rollout = Rollout(generate_tasks(1, seed=0)[0], "g", "t")

    async def attempt():
        async with (
            AsyncOpenAI(base_url=f"{dead}/v1", api_key="k", max_retries=0) as client,
            httpx.AsyncClient() as http,
        ):
            return await run_rollout(client, http, dead, rollout)

    outcome = asyncio.run(attempt())
    assert outcome.reward is None
    assert outcome.error and "Connection" in outcome.error


def test_demo_through_the_proxy(capture_stack) -> None:
    """Other tests share this proxy's lake, so only turns that started during this run count."""
    began = utc_now()
    summary = run_demo(
        prompts=2,
        rollouts=2,
        proxy_url=capture_stack.proxy_url,
        concurrency=4,
        key=capture_stack.key,
        lake=capture_stack.lake,
    )
    assert (summary.trajectories, summary.errors) == (4, 0)
    ours = (pl.col("agent") == "demo-calculator") & (pl.col("started_at") >= began)
    demo_turns = capture_stack.wait_for_rows(
        lambda frame: frame.filter(ours).height >= summary.turns
    ).filter(ours)
    assert demo_turns.height == summary.turns
    assert demo_turns["trajectory_id"].n_unique() == 4
    assert demo_turns["group_id"].n_unique() == 2
    assert demo_turns["token_source"].unique().to_list() == ["engine"]
    assert all('"ground_truth"' in metadata for metadata in demo_turns["metadata"])
    for _, steps in demo_turns.sort("started_at").group_by("trajectory_id"):
        prompts, responses = (
            steps["prompt_token_ids"].to_list(),
            steps["response_token_ids"].to_list(),
        )
        for k in range(1, len(prompts)):
            extended = prompts[k - 1] + responses[k - 1]
            assert prompts[k][: len(extended)] == extended
    trajectories = set(demo_turns["trajectory_id"])
    events = capture_stack.wait_for_rows(
        lambda frame: trajectories <= set(frame["trajectory_id"]), table="trajectory_events"
    ).filter(pl.col("trajectory_id").is_in(list(trajectories)))
    assert sorted(events["reward"].to_list()) == sorted(summary.rewards)


def test_long_sessions_read_the_workspace_through_the_engine(sim: Service) -> None:
    """Each long session lists the workspace and reads its files a call at a time; the runs
    that read every file earn the reward, and some stop early."""
    long = LongSessions(files=8, system_tokens=3000)
    system = handbook(long.system_tokens)

    async def episodes():
        async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="none", max_retries=0) as client:
            plan = [w for w in long.tasks(4, seed=11) for _ in range(6)]
            body = {"return_token_ids": True}
            runs = (play(client, w, body, long.agent(w, system)) for w in plan)
            return plan, await asyncio.gather(*runs)

    plan, results = asyncio.run(episodes())
    assert all(3 <= episode.turns <= long.files + 2 for episode in results)
    rewards = [reward(e.final_text, w.answer) for w, e in zip(plan, results, strict=True)]
    assert rewards.count(1.0) >= len(rewards) // 2
    finished = [e.turns == long.files + 2 for e in results]
    assert rewards == [1.0 if full else 0.0 for full in finished]


def test_long_demo_through_the_proxy_lands_one_sequence_per_session(capture_stack) -> None:
    began = utc_now()
    summary = run_demo(
        prompts=2,
        rollouts=2,
        proxy_url=capture_stack.proxy_url,
        concurrency=4,
        key=capture_stack.key,
        lake=capture_stack.lake,
        long=LongSessions(files=6, system_tokens=2000),
    )
    assert (summary.trajectories, summary.errors) == (4, 0)
    ours = (pl.col("agent") == LONG_AGENT) & (pl.col("started_at") >= began)
    turns = capture_stack.wait_for_rows(
        lambda frame: frame.filter(ours).height >= summary.turns
    ).filter(ours)
    assert turns.height == summary.turns >= 4 * 3
    assert turns["prompt_token_ids"].list.len().min() >= 2000
    now = turns["ended_at"].max() + timedelta(seconds=601)
    steps = extract_steps(turns, None, None, now=now, idle_timeout_s=600).steps
    assert steps["prefix_consistent"].all()
    sequences = sequence_rows(steps, capture_stack.lake.scan("turns"))
    assert sequences.height == 4  # one sequence per session
    assert sequences["turn_ids"].list.len().sum() == turns.height
    replies = turns["response_token_ids"].list.len().sum()
    assert sequences["response_mask"].list.sum().sum() == replies
