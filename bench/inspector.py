"""Benchmark: the inspector's list/filter queries and trajectory opens over HTTP on a large lake.

Builds a synthetic lake of >= 200k steps (turns + trajectory events + rewards, in the landing
schemas, appended in commits of a few thousand rows with trajectories interleaved across commits
as live traffic would) and one long session in it (100 calls, a 5k-token first prompt growing to
~50k tokens by a 150-token reply and a 300-token tool output per call, each call's prompt the
previous prompt + reply + tool output, in the messages too, decoded by the embedded engine's
tokenizer), starts `claw inspect` over it, and times the JSON endpoints and pages. The long
session's open is set against a bare read of its rows in the same run: the change data feed
of the commits they landed in, read with a predicate on their ids, as the inspector reads them,
each read right after an open (the ratio is the median of the pairs'). Prints one JSON object.
Goal: filter_p50_ms, trajectory_open_p50_ms and long_open_p50_ms <= 300.

    .venv/bin/python bench/inspector.py [--steps 200000] [--commit-rows 2000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import polars as pl
import psutil

from claw_pipelines.derived_schemas import fit
from claw_pipelines.engine.server import MODEL_NAME as EMBEDDED_MODEL
from claw_pipelines.engine.tokenizer import VOCAB_SIZE
from claw_pipelines.lake import Lake
from claw_pipelines.lake.filters import sql_in
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


LONG_ID = "long-session"
REPLY_TOKENS = 150
OBSERVATION_TOKENS = 300
CHARS_PER_TOKEN = 4


def long_session(calls: int, first_prompt: int, start: datetime) -> pl.DataFrame:
    """One prefix-consistent session of ``calls`` turns: call k's prompt is call k-1's prompt +
    its reply + a tool output, in token IDs and in messages alike."""
    rng = np.random.default_rng(0)
    step = REPLY_TOKENS + OBSERVATION_TOKENS
    sequence = rng.integers(0, VOCAB_SIZE, first_prompt + calls * step, dtype=np.int32)
    lengths = [first_prompt + k * step for k in range(calls)]
    system = {"role": "system", "content": "x" * (first_prompt * CHARS_PER_TOKEN)}
    messages: list[dict] = [system, {"role": "user", "content": "Fix the failing test."}]
    rows = []
    for k in range(calls):
        call = {"id": f"call-{k}", "type": "function"}
        reply = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}],
        }
        began = start + timedelta(seconds=20 * k)
        rows.append(
            {
                "turn_id": f"{LONG_ID}-{k:03d}",
                "started_at": began,
                "ended_at": began + timedelta(seconds=2),
                "request_messages": json.dumps(messages),
                "response_message": json.dumps(reply),
                "finish_reason": "tool_calls",
            }
        )
        output = "y" * (OBSERVATION_TOKENS * CHARS_PER_TOKEN)
        messages = [
            *messages,
            reply,
            {"role": "tool", "tool_call_id": call["id"], "content": output},
        ]
    ids = pl.Series("prompt_token_ids", [sequence[:n] for n in lengths], pl.List(pl.Int32))
    replies = [sequence[n : n + REPLY_TOKENS] for n in lengths]
    return pl.DataFrame(rows).with_columns(
        ids,
        pl.Series("response_token_ids", replies, pl.List(pl.Int32)),
        pl.Series("response_logprobs", [np.full(REPLY_TOKENS, -0.5, np.float32)] * calls),
        pl.lit(LONG_ID).alias("trajectory_id"),
        pl.lit("long-group").alias("group_id"),
        pl.lit("train").alias("channel"),
        pl.lit("coder").alias("agent"),
        pl.lit(1).alias("policy_version"),
        pl.lit(EMBEDDED_MODEL).alias("model"),
        pl.lit("chat").alias("call_type"),
        pl.lit(False).alias("stream"),
        pl.lit("success").alias("status"),
        pl.lit("engine").alias("token_source"),
        pl.lit('[{"type": "function", "function": {"name": "shell"}}]').alias("request_tools"),
        pl.Series("prompt_tokens", lengths, pl.Int32),
        pl.lit(REPLY_TOKENS, pl.Int32).alias("completion_tokens"),
        pl.lit("bench").alias("writer_id"),
    )


def append(lake: Lake, table: str, frame: pl.DataFrame, model: type, commit_rows: int) -> list[int]:
    """Land ``frame`` in commits of ``commit_rows``, in the table's schema (absent columns,
    such as those the landing schema gained since this bench was written, are null); the
    versions the commits made."""
    schema = model.arrow_schema()
    return [
        lake.append(table, fit(chunk, schema).to_arrow().cast(schema))
        for chunk in frame.iter_slices(commit_rows)
    ]


def bare_reads(lake: Lake, turn_ids: list[str], versions: list[int], times: int) -> list[float]:
    """The floor of an open: the long session's rows read from the change data feed of the
    ``versions`` they landed in, with a predicate on their ids (the index knows both)."""
    predicate = f"_change_type = 'insert' AND {sql_in('turn_id', turn_ids)}"
    spent = []
    for _ in range(times):
        began = time.perf_counter()
        table = lake.open("turns")
        rows = [
            pl.DataFrame(
                table.load_cdf(starting_version=v, ending_version=v, predicate=predicate).read_all()
            )
            for v in versions
        ]
        assert sum(r.height for r in rows) == len(turn_ids)
        spent.append((time.perf_counter() - began) * 1000)
    return spent


def timed(client: httpx.Client, paths: list[str]) -> list[float]:
    times = []
    for path in paths:
        began = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - began) * 1000)
        response.raise_for_status()
    return times


def cpu_seconds(process: psutil.Process) -> float:
    """CPU the process spent so far, every thread's: on a loaded machine the steadier figure."""
    times = process.cpu_times()
    return times.user + times.system


def percentile(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


QUICK = {"steps": 2_000, "opens": 5, "long_calls": 20, "long_first_prompt": 2_000}
"""``--quick``: every phase at a tiny size, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--commit-rows", type=int, default=2_000)
    parser.add_argument("--opens", type=int, default=60)
    parser.add_argument("--long-calls", type=int, default=100)
    parser.add_argument("--long-first-prompt", type=int, default=5_000)
    parser.add_argument("--long-commit-calls", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    workdir = Path(tempfile.mkdtemp(prefix="claw-bench-inspector-"))
    try:
        result = measure(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result))


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    """Build the lake in ``workdir``, start the inspector on it and time what it serves."""
    trajectories = args.steps // STEPS_PER_TRAJECTORY
    lake = Lake(str(workdir / "lake"))
    start = datetime.now(UTC) - timedelta(hours=1)

    began = time.perf_counter()
    turns = synthetic_turns(trajectories, start)
    events, rewards = outcomes(trajectories, start)
    commits = len(append(lake, "turns", turns, Turn, args.commit_rows))
    append(lake, "trajectory_events", events, TrajectoryEventRow, 20_000)
    append(lake, "rewards", rewards, Reward, 20_000)
    session = long_session(args.long_calls, args.long_first_prompt, start)
    long_versions = append(lake, "turns", session, Turn, args.long_commit_calls)
    lake_build_s = time.perf_counter() - began
    del turns
    long_ids = session["turn_id"].to_list()
    last_prompt_tokens = session["prompt_tokens"][-1]
    del session

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
            long_open_ms, bare_ms, open_cpu_ms, bare_cpu_ms = [], [], [], []
            inspector = psutil.Process(service.pid)
            for _ in range(11):  # alternating, so both see the same load
                cpu = cpu_seconds(inspector)
                long_open_ms += timed(client, [f"/api/trajectories/{LONG_ID}"])
                open_cpu_ms.append((cpu_seconds(inspector) - cpu) * 1000)
                cpu = time.process_time()
                bare_ms += bare_reads(lake, long_ids, long_versions, 1)
                bare_cpu_ms.append((time.process_time() - cpu) * 1000)
            long_page_ms = timed(client, [f"/trajectories/{LONG_ID}"] * 11)
            long_prompt_ms = timed(client, [f"/api/steps/{long_ids[-1]}/prompt"] * 5)
            detail = client.get(f"/api/trajectories/{LONG_ID}")
            page = client.get(f"/trajectories/{LONG_ID}")
            added = [len(step["added_token_ids"] or []) for step in detail.json()["steps"]]
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
    long_open_p50 = statistics.median(long_open_ms)
    ratios = [o / b for o, b in zip(long_open_ms, bare_ms, strict=True)]
    return {
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
        "long_calls": len(long_ids),
        "long_last_prompt_tokens": last_prompt_tokens,
        "long_added_tokens_median": statistics.median(added),
        "long_open_p50_ms": round(long_open_p50, 1),
        "long_bare_read_p50_ms": round(statistics.median(bare_ms), 1),
        "long_open_ratio_vs_bare": round(statistics.median(ratios), 2),
        "long_open_cpu_ms_p50": round(statistics.median(open_cpu_ms), 1),
        "long_bare_read_cpu_ms_p50": round(statistics.median(bare_cpu_ms), 1),
        "long_page_p50_ms": round(statistics.median(long_page_ms), 1),
        "long_open_json_kb": round(len(detail.content) / 1024),
        "long_page_kb": round(len(page.content) / 1024),
        "long_full_prompt_p50_ms": round(statistics.median(long_prompt_ms), 1),
        "refresh_lag_ms_for_new_commit": round(refresh_lag_ms, 1),
        "inspector_rss_mb": round(rss_mb),
        "goal_ms": 300,
    }


if __name__ == "__main__":
    main()
