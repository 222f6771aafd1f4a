"""Benchmark: the inspector's list/filter queries and trajectory opens over HTTP on a large lake.

Builds a synthetic lake of >= 200k steps (turns + trajectory events + rewards, in the landing
schemas, appended in commits of a few thousand rows with trajectories interleaved across commits
as live traffic would), starts `claw inspect` over it, and times the JSON endpoints the page uses.
Prints one JSON object. Goal: filter_p50_ms <= 300 and trajectory_open_p50_ms <= 300.

    .venv/bin/python bench/inspector.py [--steps 200000] [--commit-rows 2000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import polars as pl
import psutil

from claw_pipelines.lake import Lake
from claw_pipelines.processes import free_port
from claw_pipelines.schemas import Reward, TrajectoryEventRow, Turn
from claw_pipelines.stack import start_inspector

STEPS_PER_TRAJECTORY = 4
GROUP_SIZE = 4
VOCAB = 700
FILTERS = [
    "",
    "channel=train",
    "status=completed&reward_min=0.5",
    "agent=solver-b&policy_version=3",
    "text=task 4242",
    "label=unlabelled&status=open",
    "has_reward=false",
    "reward_max=0.5&channel=eval&page=3",
]


def _tokens(seed: pl.Expr, length: pl.Expr) -> pl.Expr:
    return (pl.int_ranges(seed, seed + length) * 7919 % VOCAB).cast(pl.List(pl.Int32))


def synthetic_turns(trajectories: int, start: datetime, first: int = 0) -> pl.DataFrame:
    """4 turns for each trajectory number in [first, first + trajectories), in realistic shapes
    (messages JSON, token IDs, logprobs), ordered by start time as they would land."""
    numbers = pl.int_range(first, first + trajectories, eager=True)
    steps = pl.DataFrame({"t": numbers}).join(
        pl.DataFrame({"k": pl.int_range(0, STEPS_PER_TRAJECTORY, eager=True)}), how="cross"
    )
    question = pl.format("What is {} + {}? (task {})", pl.col("t") % 97, pl.col("t") % 89, "t")
    answer = pl.format(
        "The answer is {}", (pl.col("t") % 97) + (pl.col("t") % 89) + (pl.col("t") % 3)
    )
    history = pl.lit(
        ', {"role": "assistant", "content": "thinking"}, {"role": "tool", "content": "42"}'
    )
    prompt_len = 128 + 64 * pl.col("k")
    response_len = 24 + (pl.col("t") * 13 + pl.col("k") * 5) % 48
    began = pl.lit(start) + pl.duration(milliseconds=pl.col("t") * 40 + pl.col("k") * 2500)
    frame = steps.select(
        pl.format("turn-{}-{}", "t", "k").alias("turn_id"),
        pl.format("traj-{}", "t").alias("trajectory_id"),
        pl.format("group-{}", pl.col("t") // GROUP_SIZE).alias("group_id"),
        pl.when(pl.col("t") % 5 == 0)
        .then(pl.lit("eval"))
        .otherwise(pl.lit("train"))
        .alias("channel"),
        pl.format(
            "solver-{}", pl.when(pl.col("t") % 2 == 0).then(pl.lit("a")).otherwise(pl.lit("b"))
        ).alias("agent"),
        (1 + pl.col("t") // 10_000).alias("policy_version"),
        pl.lit("policy").alias("model"),
        pl.lit("hosted_vllm http://127.0.0.1:8001/v1").alias("backend"),
        pl.lit("chat").alias("call_type"),
        pl.lit(False).alias("stream"),
        pl.when(pl.col("t") % 101 == 0)
        .then(pl.lit("error"))
        .otherwise(pl.lit("success"))
        .alias("status"),
        pl.lit(None, pl.String).alias("error"),
        pl.when(pl.col("k") == STEPS_PER_TRAJECTORY - 1)
        .then(pl.lit("stop"))
        .otherwise(pl.lit("tool_calls"))
        .alias("finish_reason"),
        pl.lit("engine").alias("token_source"),
        _tokens(pl.col("t"), prompt_len).alias("prompt_token_ids"),
        _tokens(pl.col("t") + 1000 * pl.col("k"), response_len).alias("response_token_ids"),
        pl.int_ranges(0, response_len)
        .list.eval(-(pl.element() % 11) / 4)
        .cast(pl.List(pl.Float32))
        .alias("response_logprobs"),
        pl.concat_str(
            pl.lit('[{"role": "system", "content": "You are a careful solver."}, '),
            pl.lit('{"role": "user", "content": "'),
            question,
            pl.lit('"}'),
            history.repeat_by(pl.col("k")).list.join(""),
            pl.lit("]"),
        ).alias("request_messages"),
        pl.lit('[{"type": "function", "function": {"name": "calculator"}}]').alias("request_tools"),
        pl.lit('{"temperature": 1.0, "max_tokens": 256}').alias("sampling_params"),
        pl.concat_str(pl.lit('{"role": "assistant", "content": "'), answer, pl.lit('"}')).alias(
            "response_message"
        ),
        answer.alias("response_text"),
        prompt_len.cast(pl.Int32).alias("prompt_tokens"),
        response_len.cast(pl.Int32).alias("completion_tokens"),
        began.alias("started_at"),
        (began + pl.duration(milliseconds=300)).alias("ended_at"),
        pl.lit(None, pl.Datetime("us", "UTC")).alias("first_token_at"),
        pl.lit(300.0).alias("latency_ms"),
        pl.lit("bench").alias("writer_id"),
        pl.concat_str(
            pl.lit('{"claw": {"ground_truth": "'),
            (pl.col("t") % 97).cast(pl.String),
            pl.lit('", "data_source": "arith"}}'),
        ).alias("metadata"),
    )
    return frame.sort("started_at")


def outcomes(trajectories: int, start: datetime) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Completion events and rule rewards for 90% of the trajectories (the rest stay open)."""
    done = pl.DataFrame({"t": pl.int_range(0, trajectories, eager=True)}).filter(
        pl.col("t") % 10 != 9
    )
    at = pl.lit(start) + pl.duration(seconds=15, milliseconds=pl.col("t") * 40)
    events = done.select(
        pl.format("event-{}", "t").alias("event_id"),
        pl.format("traj-{}", "t").alias("trajectory_id"),
        pl.format("group-{}", pl.col("t") // GROUP_SIZE).alias("group_id"),
        pl.lit("completed").alias("event"),
        pl.lit(None, pl.Float64).alias("reward"),
        at.alias("created_at"),
        pl.lit(None, pl.String).alias("metadata"),
    )
    rewards = done.select(
        pl.format("reward-{}", "t").alias("reward_id"),
        pl.lit(None, pl.String).alias("turn_id"),
        pl.format("traj-{}", "t").alias("trajectory_id"),
        pl.lit(None, pl.String).alias("group_id"),
        (pl.col("t") % 3 == 0).cast(pl.Float64).alias("value"),
        pl.lit("exact_match").alias("name"),
        pl.lit("rule").alias("source"),
        at.alias("created_at"),
        pl.lit(None, pl.String).alias("metadata"),
    )
    return events, rewards


def append(lake: Lake, table: str, frame: pl.DataFrame, model: type, commit_rows: int) -> int:
    schema = model.arrow_schema()
    commits = 0
    for chunk in frame.iter_slices(commit_rows):
        lake.append(table, chunk.select(schema.names).to_arrow().cast(schema))
        commits += 1
    return commits


def timed(client: httpx.Client, paths: list[str]) -> list[float]:
    times = []
    for path in paths:
        began = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - began) * 1000)
        response.raise_for_status()
    return times


def percentile(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--commit-rows", type=int, default=2_000)
    parser.add_argument("--opens", type=int, default=60)
    args = parser.parse_args()
    trajectories = args.steps // STEPS_PER_TRAJECTORY
    workdir = Path(tempfile.mkdtemp(prefix="claw-bench-inspector-"))
    lake = Lake(str(workdir / "lake"))
    start = datetime.now(UTC) - timedelta(hours=1)

    began = time.perf_counter()
    turns = synthetic_turns(trajectories, start)
    events, rewards = outcomes(trajectories, start)
    commits = append(lake, "turns", turns, Turn, args.commit_rows)
    append(lake, "trajectory_events", events, TrajectoryEventRow, 20_000)
    append(lake, "rewards", rewards, Reward, 20_000)
    lake_build_s = time.perf_counter() - began
    del turns

    port = free_port()
    service = start_inspector(port, workdir, env={"CLAW_LAKE_URI": lake.root})
    try:
        began = time.perf_counter()
        service.wait_ready("/api/health", timeout_s=600)
        index_build_s = time.perf_counter() - began
        with httpx.Client(base_url=service.url, timeout=60) as client:
            timed(client, ["/api/trajectories", "/api/trajectories/traj-0"])  # warm up
            filter_ms = timed(client, [f"/api/trajectories?{q}" for q in FILTERS] * 5)
            rng = random.Random(0)
            ids = [f"traj-{rng.randrange(trajectories)}" for _ in range(args.opens)]
            open_ms = timed(client, [f"/api/trajectories/{t}" for t in ids])
            page_ms = timed(client, [f"/trajectories/{t}" for t in ids[:20]])
            list_page_ms = timed(client, ["/trajectories?status=completed"] * 10)
            overview_ms = timed(client, ["/api/overview"] * 10)
            before = client.get("/api/overview").json()["turns_total"]
            extra = synthetic_turns(args.commit_rows // STEPS_PER_TRAJECTORY, start, trajectories)
            began = time.perf_counter()
            append(lake, "turns", extra, Turn, args.commit_rows)
            while client.get("/api/overview").json()["turns_total"] < before + extra.height:
                time.sleep(0.02)
            refresh_lag_ms = (time.perf_counter() - began) * 1000
        rss_mb = psutil.Process(service.pid).memory_info().rss / 2**20
    finally:
        service.stop()
    print(
        json.dumps(
            {
                "steps": trajectories * STEPS_PER_TRAJECTORY,
                "trajectories": trajectories,
                "turn_commits": commits,
                "rows_per_commit": args.commit_rows,
                "lake_build_s": round(lake_build_s, 1),
                "index_build_s": round(index_build_s, 1),
                "filter_p50_ms": percentile(filter_ms, 50),
                "filter_p95_ms": percentile(filter_ms, 95),
                "trajectory_open_p50_ms": percentile(open_ms, 50),
                "trajectory_open_p95_ms": percentile(open_ms, 95),
                "trajectory_page_p50_ms": percentile(page_ms, 50),
                "list_page_p50_ms": percentile(list_page_ms, 50),
                "overview_p50_ms": percentile(overview_ms, 50),
                "refresh_lag_ms_for_new_commit": round(refresh_lag_ms, 1),
                "inspector_rss_mb": round(rss_mb),
                "goal_ms": 300,
            }
        )
    )


if __name__ == "__main__":
    main()
