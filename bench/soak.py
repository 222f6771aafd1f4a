"""Benchmark: the real ``claw up`` stack under a steady load of all three agent APIs.

Starts ``claw up`` (embedded engine, capture proxy, ``dagster dev`` with the repository's
dagster.yaml, inspector) on free loopback ports in a temporary folder, then ``--agents`` agents
(default 8) play trajectories through the proxy for ``--minutes`` (default 30) at about
``--calls-per-s`` calls in all (default 25): each trajectory is ``CALLS_PER_TRAJECTORY`` calls of
one API (chat completions and Responses with the official ``openai`` SDK, Messages with the
``anthropic`` SDK; the APIs take turns), each call carrying the conversation so far, then a
reward and a completion on the proxy's own endpoints; rewards differ within each group of
``GROUP_SIZE``, so every group can make a GRPO batch. A trainer (``BatchConsumer``) takes and
acks every GRPO batch as it comes. Every shipped recipe builds its batches, as ``claw up`` ships
them; ``--recipes grpo`` keeps only those named (a config folder holding their batches.yaml,
given to ``claw up --config-dir``), as a user who trains one algorithm would.

Per ``--window-s`` window (default 60 s): ``refresh_s`` (median duration of the refresh runs
started in it, from Dagster's run storage: start to end), ``refresh_queue_s`` (creation to
start) and ``refresh_steps_s`` (each step's median duration in those runs, from their event
logs: which asset's cost grows), ``batch_latency_s`` (``next()`` returned minus its last
trajectory's completion, as ``batch_latency.py`` measures it), the log and data bytes of each
landing table at the window's end (and ``derived_bytes``, of every other table), its commits
and ``commit_ms`` (p50/p99 of the commits' ``execution_time_ms`` in their Delta commit info),
and the proxy's ``p50_s``/``p99_s`` (client-side call latency) and calls/s.

Prints one JSON object: ``refresh_growth`` (median refresh duration of the last ``GROWTH_S``
÷ the first; a third of the soak when it is shorter than 15 minutes), ``batch_latency_p95_s``
(whole soak), ``log_bytes_ratio`` (largest log ÷ data bytes of a landing table at the end),
``lost`` (answered turns, rewards and completions not in their table once the spool drained),
``duplicated`` (rows past the first of a key), ``dagster_bytes`` (the Dagster instance's
storage at the end: runs, event logs, captured logs, sensor ticks and evaluations; the
``dagster_history`` schedule deletes what is older than a day) and per refresh run,
``load_average`` and ``windows``.

    .venv/bin/python bench/soak.py [--minutes 30] [--agents 8] [--calls-per-s 25] [--recipes grpo]
    .venv/bin/python bench/soak.py --quick           # the suite's tiny run (--recipes grpo)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import anthropic
import httpx
import openai
import polars as pl
import yaml
from batch_latency import _completed_at, _graphql, _percentile

from claw_pipelines.config_files import shipped_file
from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port, start_service, stop_group
from claw_pipelines.schemas import LANDING_MODELS
from claw_pipelines.settings import LOCAL_MASTER_KEY
from claw_pipelines.stack import CLI
from claw_pipelines.trainer import BatchConsumer

RECIPE = "grpo"
APIS = ("chat", "responses", "messages")
CALLS_PER_TRAJECTORY = 3
GROUP_SIZE = 4
LANDING = ("turns", "rewards", "trajectory_events")
GROWTH_S = 300.0
START_TIMEOUT_S = 600.0
DRAIN_TIMEOUT_S = 180.0
QUESTION = "What is 17 + 25? Think step by step."

REFRESH_RUNS = """
query Runs {
  runsOrError(limit: 100000) {
    ... on Runs {
      results {
        status creationTime startTime endTime assetSelection { path }
        stepStats { stepKey startTime endTime }
      }
    }
  }
}
"""


@dataclass
class Answered:
    """What the proxy answered: turn, reward and completion ids, and each call's time."""

    turns: list[str] = field(default_factory=list)
    rewards: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    calls: list[tuple[float, float]] = field(default_factory=list)
    """(answered at, seconds) per model call."""
    errors: int = 0


class Agents:
    """``agents`` agents, each paced to ``calls_per_s / agents`` calls a second, that finish the
    trajectory they are in once asked to stop, so every trajectory they began is complete."""

    def __init__(self, proxy_url: str, key: str, agents: int, calls_per_s: float) -> None:
        self.proxy_url = proxy_url
        self.key = key
        self.agents = agents
        self.interval_s = agents / calls_per_s
        self.answered = Answered()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        headers = {"authorization": f"Bearer {self.key}"}
        async with httpx.AsyncClient(base_url=self.proxy_url, timeout=60, headers=headers) as http:
            await asyncio.gather(*(self._agent(index, http) for index in range(self.agents)))

    async def _agent(self, index: int, http: httpx.AsyncClient) -> None:
        chat = openai.AsyncOpenAI(base_url=self.proxy_url, api_key=self.key, max_retries=0)
        messages = anthropic.AsyncAnthropic(base_url=self.proxy_url, api_key=self.key,
                                            max_retries=0)  # fmt: skip
        next_at = time.monotonic() + self.interval_s * index / self.agents
        number = 0
        async with chat, messages:
            while not self.stop.is_set():
                trajectory = f"soak-{index}-{number}"
                group = f"soak-{index}-g{number // GROUP_SIZE}"
                api = APIS[(index + number) % len(APIS)]
                prefix = f"{self.proxy_url}/t/{trajectory}/{group}"
                history: list[dict[str, str]] = []
                for _ in range(CALLS_PER_TRAJECTORY):
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    next_at = max(next_at + self.interval_s, time.monotonic())
                    history.append({"role": "user", "content": QUESTION})
                    reply = await self._call(api, chat, messages, prefix, history)
                    history.append({"role": "assistant", "content": reply or "…"})
                await self._close(http, trajectory, (number % GROUP_SIZE) / (GROUP_SIZE - 1))
                number += 1

    async def _call(self, api, chat, messages, prefix, history) -> str | None:
        """One model call of ``api``; its turn id and time are recorded, its text returned."""
        started = time.monotonic()
        try:
            if api == "messages":
                client = messages.with_options(base_url=prefix).messages.with_raw_response
                raw = await client.create(model="policy", messages=history, max_tokens=32)
                text = "".join(b.text for b in (await raw.parse()).content if b.type == "text")
            elif api == "responses":
                client = chat.with_options(base_url=f"{prefix}/v1").responses.with_raw_response
                raw = await client.create(model="policy", input=history, max_output_tokens=32)
                text = raw.parse().output_text
            else:
                client = chat.with_options(base_url=f"{prefix}/v1").chat.completions
                raw = await client.with_raw_response.create(
                    model="policy", messages=history, max_tokens=32
                )
                text = raw.parse().choices[0].message.content
        except (openai.APIError, anthropic.APIError):
            self.answered.errors += 1
            return None
        self.answered.calls.append((time.time(), time.monotonic() - started))
        self.answered.turns.append(raw.headers["x-litellm-call-id"])
        return text

    async def _close(self, http: httpx.AsyncClient, trajectory: str, value: float) -> None:
        """The reward, then the completion, as an environment posts them. A post that got no
        answer counts as an error, as a failed call does: one reset must not end the load."""
        posts = (
            ("/claw/v1/rewards", {"trajectory_id": trajectory, "value": value}, "reward_id"),
            (f"/claw/v1/trajectories/{trajectory}/complete", {}, "event_id"),
        )
        for (path, body, key), answered in zip(
            posts, (self.answered.rewards, self.answered.events), strict=True
        ):
            try:
                answer = await http.post(path, json=body)
            except httpx.TransportError:
                self.answered.errors += 1
                continue
            if answer.is_success:
                answered.append(answer.json()[key])
            else:
                self.answered.errors += 1


@dataclass
class Trainer:
    """Takes and acks every GRPO batch; records each one's latency."""

    lake: Lake
    latencies: list[tuple[float, float]] = field(default_factory=list)
    """(returned at, seconds from its last completion)."""

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        consumer = BatchConsumer(RECIPE, consumer="soak", lake_uri=self.lake.root)
        step = 0
        while not self.stop.is_set():
            batch = consumer.next(timeout_s=2)
            if batch is None:
                continue
            returned = datetime.now(UTC)
            completed = _completed_at(self.lake, batch)
            self.latencies.append((returned.timestamp(), (returned - completed).total_seconds()))
            step += 1
            consumer.ack(batch.batch_id, trainer_step=step)


def _file_bytes(root: Path) -> dict[Path, int]:
    """Size of each file under ``root``; a file the stack's maintenance deletes while it is
    listed (a superseded checkpoint, a vacuumed file) counts as gone."""
    sizes = {}
    for path in root.rglob("*") if root.exists() else ():
        with contextlib.suppress(FileNotFoundError):
            if path.is_file():
                sizes[path] = path.stat().st_size
    return sizes


def table_bytes(lake: Lake, tables: tuple[str, ...] = LANDING) -> dict[str, dict[str, int]]:
    """Bytes of each of ``tables``' log and data files (the lake is on local disk)."""
    sizes = {}
    for table in tables:
        files = _file_bytes(Path(lake.uri(table)))
        log = sum(size for path, size in files.items() if path.parent.name == "_delta_log")
        sizes[table] = {"log_bytes": log, "data_bytes": sum(files.values()) - log}
    return sizes


def derived_tables(lake: Lake) -> tuple[str, ...]:
    """The lake's tables other than the landing ones (each a folder with a Delta log)."""
    root = Path(lake.root_uri)
    return tuple(sorted(p.parent.name for p in root.glob("*/_delta_log") if p.parent.name
                        not in LANDING))  # fmt: skip


def new_commits(lake: Lake, seen: dict[str, int]) -> dict[str, dict]:
    """Each landing table's data commits since ``seen`` (updated): count and execution time."""
    figures = {}
    for table in LANDING:
        delta_table = lake.open(table)
        if delta_table is None:
            continue
        version = delta_table.version()
        count = version - seen.get(table, -1)
        seen[table] = version
        writes = [c for c in delta_table.history(count) if c["operation"] == "WRITE"]
        times = [c["operationMetrics"]["execution_time_ms"] for c in writes]
        figures[table] = {
            "commits": len(writes),
            "other_commits": count - len(writes),
            "commit_ms_p50": statistics.median(times) if times else None,
            "commit_ms_p99": _percentile(times, 0.99) if times else None,
        }
    return figures


def refresh_runs(dagster_url: str) -> pl.DataFrame:
    """The refresh runs (those that materialize ``steps``) that succeeded, from Dagster's run
    storage, each with its steps' durations (``steps``: step key and seconds, STEP_START to
    STEP_SUCCESS in its event log)."""
    runs = _graphql(dagster_url, REFRESH_RUNS, {})["runsOrError"]["results"]
    rows = [
        {
            "created": r["creationTime"],
            "started": r["startTime"],
            "ended": r["endTime"],
            "steps": [
                {"step": s["stepKey"], "s": s["endTime"] - s["startTime"]}
                for s in r["stepStats"]
                if s["startTime"] is not None and s["endTime"] is not None
            ],
        }
        for r in runs
        if r["status"] == "SUCCESS" and ["steps"] in [k["path"] for k in r["assetSelection"] or []]
    ]
    step = pl.Struct({"step": pl.String, "s": pl.Float64})
    schema = {"created": pl.Float64, "started": pl.Float64, "ended": pl.Float64,
              "steps": pl.List(step)}  # fmt: skip
    return pl.DataFrame(rows, schema=schema).sort("started")


def step_medians(runs: pl.DataFrame) -> dict[str, float]:
    """Median duration of each step (asset) over ``runs``, longest first."""
    steps = runs.select(pl.col("steps").explode(empty_as_null=True)).unnest("steps")
    steps = steps.drop_nulls("step")
    medians = steps.group_by("step").agg(pl.col("s").median().round(3)).sort("s", descending=True)
    return dict(medians.iter_rows())


def window_figures(began: float, window_s: float, runs: pl.DataFrame, agents: Agents,
                   trainer: Trainer, samples: list[dict]) -> list[dict]:  # fmt: skip
    """Each window's refresh runs, batches and calls, with the lake sampled at its end."""
    calls = pl.DataFrame(agents.answered.calls, schema=["at", "s"], orient="row")
    batches = pl.DataFrame(trainer.latencies, schema=["at", "s"], orient="row")
    windows = []
    for index, sample in enumerate(samples):
        start, end = began + index * window_s, began + (index + 1) * window_s
        in_runs = runs.filter(pl.col("started").is_between(start, end, closed="left"))
        in_calls = calls.filter(pl.col("at").is_between(start, end, closed="left"))["s"]
        in_batches = batches.filter(pl.col("at").is_between(start, end, closed="left"))["s"]
        windows.append({
            "window": index,
            "refresh_runs": in_runs.height,
            "refresh_s": _median(in_runs["ended"] - in_runs["started"]),
            "refresh_queue_s": _median(in_runs["started"] - in_runs["created"]),
            "refresh_steps_s": step_medians(in_runs),
            "batches": in_batches.len(),
            "batch_latency_s": _median(in_batches),
            "calls_per_s": round(in_calls.len() / window_s, 1),
            "p50_s": _quantile(in_calls, 0.5),
            "p99_s": _quantile(in_calls, 0.99),
            **sample,
        })  # fmt: skip
    return windows


def _median(values: pl.Series) -> float | None:
    return _quantile(values, 0.5)


def _quantile(values: pl.Series, q: float) -> float | None:
    return None if values.is_empty() else round(values.quantile(q), 3)


def growth(runs: pl.DataFrame, began: float, ended: float) -> float | None:
    """Median refresh duration in the last ``GROWTH_S`` of the load ÷ in the first (a third of
    the load when it is shorter than three times that)."""
    span = min(GROWTH_S, (ended - began) / 3)
    durations = runs.with_columns((pl.col("ended") - pl.col("started")).alias("s"))
    first = durations.filter(pl.col("started") < began + span)["s"]
    last = durations.filter(pl.col("started") >= ended - span)["s"]
    if first.is_empty() or last.is_empty():
        return None
    return round(last.median() / first.median(), 3)


def landed(lake: Lake, answered: Answered) -> tuple[int, int]:
    """(lost, duplicated): answered ids missing from their table, and rows past a key's first."""
    lost = duplicated = 0
    for table, ids in zip(LANDING, (answered.turns, answered.rewards, answered.events),
                          strict=True):  # fmt: skip
        key = LANDING_MODELS[table].key
        scan = lake.scan(table)
        rows = (
            pl.DataFrame({key: []}, schema={key: pl.String})
            if scan is None
            else scan.select(key).collect()
        )
        lost += (
            pl.DataFrame({key: ids}, schema={key: pl.String}).join(rows, on=key, how="anti").height
        )
        duplicated += rows.height - rows[key].n_unique()
    return lost, duplicated


def wait_drained(lake: Lake, answered: Answered) -> None:
    """Until every answered id is in its table (the proxy commits asynchronously)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while landed(lake, answered)[0] and time.monotonic() < deadline:
        time.sleep(1)


def shipped_recipes() -> dict:
    return yaml.safe_load(shipped_file("batches.yaml").read_text())


def config_dir(workdir: Path, recipes: list[str]) -> Path:
    """A config folder whose batches.yaml holds only ``recipes`` of the shipped ones."""
    shipped = shipped_recipes()
    kept = [recipe for recipe in shipped["recipes"] if recipe["name"] in recipes]
    unknown = set(recipes) - {recipe["name"] for recipe in kept}
    if unknown:
        raise SystemExit(f"--recipes: no shipped recipe named {sorted(unknown)}")
    folder = workdir / "config"
    folder.mkdir(exist_ok=True)
    (folder / "batches.yaml").write_text(yaml.safe_dump({**shipped, "recipes": kept}))
    return folder


def start_up(workdir: Path, config: Path | None, minutes: float) -> tuple[Service, dict[str, int]]:
    """``claw up`` on free ports, as a user runs it; returns once it says it is up. Dagster
    keeps its runs for the whole soak (``CLAW_RUN_HISTORY_HOURS``): the refresh figures are
    read from its run storage at the end."""
    ports = {name: free_port() for name in ("proxy", "dagster", "inspector", "engine")}
    command = [*CLI, "up", *[f"--{name}-port={port}" for name, port in ports.items()]]
    command += ["--config-dir", str(config)] if config else []
    env = {
        "LITELLM_MASTER_KEY": LOCAL_MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "CLAW_RUN_HISTORY_HOURS": str(max(24, math.ceil(minutes / 60) + 1)),
    }
    up = start_service("claw-up", command, "", workdir / "up.log", env=env, cwd=workdir)
    deadline = time.monotonic() + START_TIMEOUT_S
    while "claw-pipelines is up" not in up.log_tail(10_000):
        if not up.alive() or time.monotonic() > deadline:
            stop_group(up.process, grace_s=5)
            raise SystemExit(f"claw up did not come up:\n{up.log_tail()}")
        time.sleep(1)
    return up, ports


def soak(
    workdir: Path,
    minutes: float,
    window_s: float,
    agents: int,
    calls_per_s: float,
    recipes: list[str] | None,
) -> dict:
    up, ports = start_up(workdir, config_dir(workdir, recipes) if recipes else None, minutes)
    lake = Lake(str(workdir / ".claw" / "lake"))
    proxy_url = f"http://127.0.0.1:{ports['proxy']}"
    load = Agents(proxy_url, LOCAL_MASTER_KEY, agents, calls_per_s)
    trainer = Trainer(lake)
    samples: list[dict] = []
    seen: dict[str, int] = {}
    try:
        load.thread.start()
        trainer.thread.start()
        began = time.time()
        for index in range(max(1, round(minutes * 60 / window_s))):
            time.sleep(max(0.0, began + (index + 1) * window_s - time.time()))
            commits = new_commits(lake, seen)
            sizes = table_bytes(lake)
            derived = table_bytes(lake, derived_tables(lake))
            samples.append({table: {**sizes[table], **commits.get(table, {})}
                            for table in LANDING} | {"derived_bytes": derived})  # fmt: skip
        ended = time.time()
        load.stop.set()
        load.thread.join(timeout=120)
        wait_drained(lake, load.answered)
        trainer.stop.set()
        trainer.thread.join(timeout=60)
        runs = refresh_runs(f"http://127.0.0.1:{ports['dagster']}")
        lost, duplicated = landed(lake, load.answered)
        end_sizes = table_bytes(lake)
        end_derived = table_bytes(lake, derived_tables(lake))
        dagster_bytes = sum(_file_bytes(workdir / ".claw" / "dagster").values())
    finally:
        os.kill(up.pid, signal.SIGINT)
        try:
            up.process.wait(timeout=120)
        finally:
            stop_group(up.process, grace_s=5)
    latencies = [s for _, s in trainer.latencies]
    return {
        "benchmark": "soak",
        "refresh_growth": growth(runs, began, ended),
        "batch_latency_p95_s": round(_percentile(latencies, 0.95), 2) if latencies else None,
        "log_bytes_ratio": round(
            max(s["log_bytes"] / max(s["data_bytes"], 1) for s in end_sizes.values()), 3
        ),
        "lost": lost,
        "duplicated": duplicated,
        "answered": {
            "turns": len(load.answered.turns),
            "rewards": len(load.answered.rewards),
            "completions": len(load.answered.events),
        },
        "errors": load.answered.errors,
        "batches": len(latencies),
        "refresh_runs": runs.height,
        "minutes": minutes,
        "agents": agents,
        "recipes": recipes or [recipe["name"] for recipe in shipped_recipes()["recipes"]],
        "calls_per_s": round(len(load.answered.calls) / (ended - began), 1),
        "end_bytes": end_sizes,
        "end_derived_bytes": end_derived,
        "dagster_bytes": dagster_bytes,
        "dagster_bytes_per_run": round(dagster_bytes / max(runs.height, 1)),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "windows": window_figures(began, window_s, runs, load, trainer, samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--calls-per-s", type=float, default=25.0, help="all agents together")
    parser.add_argument(
        "--quick", action="store_true", help="20 s of load in 10 s windows, GRPO's recipe only"
    )
    parser.add_argument("--workdir", help="keep the stack's folder (logs, lake) here")
    parser.add_argument(
        "--recipes", nargs="+", help="only these shipped recipes build batches (default: all)"
    )
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.window_s = 20 / 60, 10.0
        args.recipes = args.recipes or ["grpo"]
    with tempfile.TemporaryDirectory(prefix="claw-soak-") as folder:
        workdir = Path(args.workdir or folder)
        workdir.mkdir(parents=True, exist_ok=True)
        result = soak(
            workdir, args.minutes, args.window_s, args.agents, args.calls_per_s, args.recipes
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
