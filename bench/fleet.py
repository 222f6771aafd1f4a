"""Benchmark: a fleet of capture writers on one ``s3://`` lake (moto's S3 server on loopback).

For each fleet size (``--writers``, default 1, 4 and 16) a fresh lake (a bucket of its own) and
N writer processes. Each writer is what a proxy worker runs without LiteLLM: the environment a
proxy reads (``CLAW_LAKE_URI``, ``CLAW_STORAGE_OPTIONS``, ``CLAW_SPOOL_DIR``),
``CaptureRuntime.current()`` (spool, spool flusher, commit path, policy poller and whatever
else the runtime starts) and ``CaptureRuntime.land``, the call that precedes a proxy's 200. It
offers a steady load, ``--calls-per-s`` calls (default 25, one proxy worker under the soak's
load): each call lands a turn, and every third call of a trajectory closes it with a reward
then a completion event, each landed on its own, as the proxy lands them. Every row carries the
wall-clock time it was landed (``ended_at`` / ``created_at``).

A reader in this process polls the three landing tables every ``POLL_S`` and reads what each
new version added (``lake.changes``); a row is *readable* when a poll first sees it
(resolution ``POLL_S``). Once every landed row was seen (or ``DRAIN_TIMEOUT_S`` passed), the
writers stop gracefully and the tables are read whole.

Per fleet size: ``rows_per_s`` (rows landed / seconds from the start of the load to the last
row readable), ``readable_p50_s``/``readable_p99_s`` (landed -> readable), per table
``data_commits`` (the appends in its history), ``commits_per_s`` (over the same span as rows/s,
in all and per writer), ``commit_ms_p50``/``commit_ms_p99`` (an append's
``execution_time_ms``, retries included) and ``retries`` (its ``num_retries``), ``versions``
(maintenance included), ``conflicts`` (log entries a writer tried to create and the store
refused with 412, counted in the S3 server's request log; ``ensure``'s creation races
included), ``errors``
(records the writers logged at ERROR: failed flushes), ``lost`` (landed, never in the table),
``duplicated`` (rows past the first of a key), ``log_bytes``/``data_bytes`` per table at the end.
Top level: ``scaling_16`` (rows/s at 16 writers / at 1; null when 16 was not run),
``readable_p99_s``, ``lost``, ``duplicated`` (worst or sum over the sizes) and ``load_average``.

    .venv/bin/python bench/fleet.py [--writers 1,4,16] [--seconds 60] [--calls-per-s 25]
    .venv/bin/python bench/fleet.py --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import psutil

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "objectstore"), str(TESTS)]  # the tests' S3 server, started as they do

from s3_lake import S3, lake_env, start_s3  # noqa: E402

from claw_pipelines.lake import Lake  # noqa: E402
from claw_pipelines.lake.changes import changes  # noqa: E402
from claw_pipelines.processes import stop_group  # noqa: E402
from claw_pipelines.schemas import (  # noqa: E402
    LANDING_MODELS,
    LandingRow,
    Reward,
    TrajectoryEventRow,
    Turn,
    utc_now,
)

TABLES = ("turns", "rewards", "trajectory_events")
LANDED_AT = {"turns": "ended_at", "rewards": "created_at", "trajectory_events": "created_at"}
CALLS_PER_TRAJECTORY = 3
POLL_S = 0.5
DRAIN_TIMEOUT_S = 120.0
TOKEN_VARIANTS = 16
READY_TIMEOUT_S = 600.0


# ---- a writer process -------------------------------------------------------------------------


@functools.cache
def token_ids(writer: int, variant: int, length: int) -> list[int]:
    """Random token IDs, made once per (writer, variant, length) and reused, so a writer's CPU
    goes to what a proxy worker does with a turn, not to drawing random numbers."""
    rng = random.Random(writer * 1_000_003 + variant * 7_919 + length)
    return [rng.randrange(50_000) for _ in range(length)]


@functools.cache
def logprobs(writer: int, variant: int, length: int) -> list[float]:
    return [-1e-3 * (token % 1000) for token in token_ids(writer, variant, length)]


def call_rows(writer: int, call: int, prompt_tokens: int, response_tokens: int) -> list[LandingRow]:
    """What one agent call lands, one ``land`` each: its turn and, on the trajectory's last
    call, a reward and the completion. Keys are ``w<writer>-<kind><call>``, so the reader can
    tell which rows were landed from the writers' call counts alone."""
    variant = call % TOKEN_VARIANTS
    trajectory = f"w{writer}-t{call // CALLS_PER_TRAJECTORY}"
    group = f"w{writer}-g{call // (4 * CALLS_PER_TRAJECTORY)}"
    now = utc_now()
    rows: list[LandingRow] = [
        Turn(
            turn_id=f"w{writer}-c{call}",
            trajectory_id=trajectory,
            group_id=group,
            model="policy",
            api="chat",
            token_source="engine",
            prompt_token_ids=token_ids(writer, variant, prompt_tokens),
            response_token_ids=token_ids(writer, variant, response_tokens),
            response_logprobs=logprobs(writer, variant, response_tokens),
            response_text=f"answer {call}",
            started_at=now,
            ended_at=now,
        )
    ]
    if call % CALLS_PER_TRAJECTORY == CALLS_PER_TRAJECTORY - 1:
        rows.append(Reward(reward_id=f"w{writer}-r{call}", trajectory_id=trajectory,
                           value=variant / TOKEN_VARIANTS))  # fmt: skip
        rows.append(TrajectoryEventRow(event_id=f"w{writer}-e{call}", trajectory_id=trajectory,
                                       group_id=group))  # fmt: skip
    return rows


def landed_keys(writer: int, calls: int) -> dict[str, list[str]]:
    """The keys of the rows ``calls`` calls of ``writer`` landed (``call_rows``' keys)."""
    closing = [c for c in range(calls) if c % CALLS_PER_TRAJECTORY == CALLS_PER_TRAJECTORY - 1]
    return {
        "turns": [f"w{writer}-c{c}" for c in range(calls)],
        "rewards": [f"w{writer}-r{c}" for c in closing],
        "trajectory_events": [f"w{writer}-e{c}" for c in closing],
    }


class ErrorCount(logging.Handler):
    """Counts the records logged at ERROR (a failed flush or commit logs one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def run_writer(index: int, calls_per_s: float, seconds: float, prompt: int, response: int) -> None:
    """One writer: ready -> (stdin ``go``) steady load -> report -> (stdin ``stop``) graceful
    stop. Talks JSON lines on stdout."""
    from claw_pipelines.capture.runtime import CaptureRuntime  # imports litellm: writers only

    errors = ErrorCount()
    logging.basicConfig(level=logging.WARNING)  # to the writer's log
    logging.getLogger("claw_pipelines.spool.staging").setLevel(logging.INFO)
    logging.getLogger().addHandler(errors)
    runtime = CaptureRuntime.current()
    print(json.dumps({"ready": runtime.writer.writer_id}), flush=True)
    sys.stdin.readline()
    start, cpu = time.monotonic(), time.process_time()
    calls, behind = 0, 0.0
    while (due := start + calls / calls_per_s) < start + seconds:
        behind = max(behind, time.monotonic() - due)
        time.sleep(max(0.0, due - time.monotonic()))
        for row in call_rows(index, calls, prompt, response):
            runtime.land([row])
        calls += 1
    cpu_per_s = (time.process_time() - cpu) / (time.monotonic() - start)
    print(json.dumps({"calls": calls, "max_behind_s": round(behind, 3),
                      "cpu_per_s": round(cpu_per_s, 3)}), flush=True)  # fmt: skip
    sys.stdin.readline()
    CaptureRuntime.shutdown_current()
    print(json.dumps({"errors": errors.count}), flush=True)


# ---- the measuring process --------------------------------------------------------------------


@dataclass
class Reader:
    """Polls the landing tables and records when each row was first seen."""

    lake: Lake
    seen: dict[str, list[pl.DataFrame]] = field(default_factory=lambda: {t: [] for t in TABLES})
    counts: Counter = field(default_factory=Counter)
    poll_s: list[float] = field(default_factory=list)
    """How long each poll of the three tables took: a row's readable time includes it."""

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        handles, versions = {}, {}
        while not self.stop.wait(POLL_S):
            began = time.monotonic()
            for table in TABLES:
                handle = handles.get(table) or self.lake.open(table)
                if handle is None:
                    continue
                handles[table] = handle
                handle.update_incremental()
                version = handle.version()
                key, landed_at = LANDING_MODELS[table].key, LANDED_AT[table]
                new = changes(handle, versions.get(table), version, [key, landed_at],
                              with_version=True)  # fmt: skip
                versions[table] = version
                if new is not None and new.height:
                    at = time.time()
                    self.seen[table].append(new.with_columns(pl.lit(at).alias("seen_at")))
                    self.counts[table] += new.height
            self.poll_s.append(time.monotonic() - began)

    def frame(self, table: str) -> pl.DataFrame:
        return pl.concat(self.seen[table]) if self.seen[table] else pl.DataFrame()


def _conflicts(s3_log: Path, bucket: str, offset: int) -> Counter:
    """412 answers to PUTs of log entries per table in the S3 server's request log (from
    byte ``offset``): each is a commit that lost a race and was retried."""
    pattern = re.compile(rf'"\S*(?:PUT|POST) /{bucket}/lake/(\w+)/_delta_log/[^"]*" 412 ')
    with s3_log.open("rb") as file:
        file.seek(offset)
        text = file.read().decode(errors="replace")
    return Counter(match[1] for match in pattern.finditer(text))


def _bytes(s3: S3, lake: Lake) -> dict[str, dict[str, int]]:
    """Bytes of each table's log and data files in the bucket at the end."""
    bucket = lake.root.removeprefix("s3://").split("/", 1)[0]
    sizes = {t: {"log_bytes": 0, "data_bytes": 0} for t in TABLES}
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="lake/")
    for item in (item for page in pages for item in page.get("Contents", [])):
        table, _, rest = item["Key"].removeprefix("lake/").partition("/")
        if table in sizes:
            kind = "log_bytes" if rest.startswith("_delta_log/") else "data_bytes"
            sizes[table][kind] += item["Size"]
    return sizes


def _writer_command(index: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, __file__, "--writer", str(index), "--seconds", str(args.seconds),
            "--calls-per-s", str(args.calls_per_s), "--prompt-tokens", str(args.prompt_tokens),
            "--response-tokens", str(args.response_tokens)]  # fmt: skip


def _line(process: subprocess.Popen, timeout_s: float) -> dict:
    """The writer's next JSON line (its other output goes to its log)."""
    answer: list[str] = []
    reading = threading.Thread(target=lambda: answer.append(process.stdout.readline()))
    reading.start()
    reading.join(timeout_s)
    if not answer or not answer[0]:
        raise SystemExit(f"writer {process.pid} did not answer within {timeout_s:.0f} s")
    return json.loads(answer[0])


def _tell(processes: list[subprocess.Popen], word: str) -> None:
    for process in processes:
        process.stdin.write(f"{word}\n")
        process.stdin.flush()


def measure(writers: int, s3: S3, workdir: Path, args: argparse.Namespace) -> dict:
    """One fleet size on a fresh lake."""
    lake = s3.new_lake()
    root = workdir / f"fleet-{writers}"
    env = {**os.environ, **lake_env(lake.root, lake.storage_options),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "CLAW_COMMIT_MODE": args.commit_mode}  # fmt: skip
    s3_log = workdir / "s3.log"
    log_offset = s3_log.stat().st_size
    processes: list[subprocess.Popen] = []
    reader = Reader(lake)
    try:
        for index in range(writers):
            home = root / f"writer-{index}"
            home.mkdir(parents=True)
            processes.append(subprocess.Popen(
                _writer_command(index, args), cwd=home, text=True, start_new_session=True,
                env={**env, "CLAW_SPOOL_DIR": str(home / "spool")},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=(home / "writer.log").open("w"),
            ))  # fmt: skip
        for process in processes:
            _line(process, READY_TIMEOUT_S)
        reader.thread.start()
        _tell(processes, "go")
        began, s3_cpu = time.time(), _cpu_s(s3.service.pid)
        loads = [_line(process, args.seconds + 120) for process in processes]
        expected = {t: [] for t in TABLES}
        for index, load in enumerate(loads):
            for table, keys in landed_keys(index, load["calls"]).items():
                expected[table] += keys
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while any(reader.counts[t] < len(expected[t]) for t in TABLES):
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        reader.stop.set()
        reader.thread.join()
        s3_cpu_per_s = (_cpu_s(s3.service.pid) - s3_cpu) / (time.time() - began)
        _tell(processes, "stop")
        stops = [_line(process, 120) for process in processes]
        for process in processes:
            process.wait(timeout=60)
    finally:
        reader.stop.set()
        for process in processes:
            stop_group(process, grace_s=10)
    bucket = lake.root.removeprefix("s3://").split("/")[0]
    conflicts = _conflicts(s3_log, bucket, log_offset)
    figures = _figures(writers, lake, s3, reader, expected, began, loads, stops, conflicts,
                       args.seconds)  # fmt: skip
    return {**figures, "s3_server_cpu_per_s": round(s3_cpu_per_s, 3)}


def _cpu_s(pid: int) -> float:
    """CPU seconds a process (the S3 server) has used so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _figures(
    writers: int,
    lake: Lake,
    s3: S3,
    reader: Reader,
    expected: dict[str, list[str]],
    began: float,
    loads: list[dict],
    stops: list[dict],
    conflicts: Counter,
    seconds: float,
) -> dict:
    """The figures of one fleet size from what the reader saw and the tables at the end."""
    seen = {t: reader.frame(t) for t in TABLES}
    delays = pl.concat(
        [
            frame.select(
                (pl.col("seen_at") - pl.col(LANDED_AT[t]).dt.epoch("us") / 1e6).alias("delay")
            )
            for t, frame in seen.items()
            if frame.height
        ]
    )["delay"]
    last_seen = max(frame["seen_at"].max() for frame in seen.values() if frame.height)
    lost = duplicated = rows = 0
    per_table = {}
    sizes = _bytes(s3, lake)
    for table in TABLES:
        key = LANDING_MODELS[table].key
        final = lake.scan(table).select(key).collect()
        wanted = pl.DataFrame({key: expected[table]})
        lost += wanted.join(final, on=key, how="anti").height
        duplicated += final.height - final[key].n_unique()
        rows += final.height
        writes = [c for c in lake.open(table).history() if c["operation"] == "WRITE"]
        times = pl.Series([c["operationMetrics"]["execution_time_ms"] for c in writes])
        per_table[table] = {
            "rows": final.height,
            "data_commits": len(writes),
            "commits_per_s": round(len(writes) / (last_seen - began), 2),
            "commits_per_s_per_writer": round(len(writes) / (last_seen - began) / writers, 2),
            "versions": lake.version(table) + 1,
            "conflicts": conflicts[table],
            "retries": sum(c["operationMetrics"]["num_retries"] for c in writes),
            "commit_ms_p50": times.quantile(0.5),
            "commit_ms_p99": times.quantile(0.99),
            **sizes[table],
        }
    return {
        "writers": writers,
        "offered_rows_per_s": round(sum(len(v) for v in expected.values()) / seconds, 1),
        "rows_per_s": round(rows / (last_seen - began), 1),
        "readable_p50_s": round(delays.quantile(0.5), 2),
        "readable_p99_s": round(delays.quantile(0.99), 2),
        "lost": lost,
        "duplicated": duplicated,
        "errors": sum(stop["errors"] for stop in stops),
        "max_behind_s": max(load["max_behind_s"] for load in loads),
        "writer_cpu_per_s": round(sum(load["cpu_per_s"] for load in loads), 3),
        "reader_poll_s_p50": round(statistics.median(reader.poll_s), 3) if reader.poll_s else None,
        "reader_poll_s_max": round(max(reader.poll_s), 3) if reader.poll_s else None,
        "tables": per_table,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", default="1,4,16", help="fleet sizes, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="load per fleet size")
    parser.add_argument("--calls-per-s", type=float, default=25.0, help="per writer")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--response-tokens", type=int, default=64)
    parser.add_argument("--commit-mode", choices=["staged", "direct"], default="staged",
                        help="the writers' CLAW_COMMIT_MODE")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="1 and 2 writers, 3 s each")
    parser.add_argument("--workdir", help="keep the S3 log and writers' logs here")
    parser.add_argument("--writer", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer is not None:
        run_writer(args.writer, args.calls_per_s, args.seconds, args.prompt_tokens,
                   args.response_tokens)  # fmt: skip
        return
    if args.quick:
        args.writers, args.seconds = "1,2", 3.0
    sizes = [int(n) for n in args.writers.split(",")]
    with tempfile.TemporaryDirectory(prefix="claw-fleet-") as folder:
        workdir = Path(args.workdir or folder)
        s3 = start_s3(workdir)
        try:
            results = {n: measure(n, s3, workdir, args) for n in sizes}
        finally:
            s3.service.stop()
    rate = {n: r["rows_per_s"] for n, r in results.items()}
    print(json.dumps({
        "benchmark": "fleet",
        "scaling_16": round(rate[16] / rate[1], 2) if {1, 16} <= rate.keys() else None,
        "scaling": {n: round(r / rate[sizes[0]], 2) for n, r in rate.items()},
        "readable_p99_s": max(r["readable_p99_s"] for r in results.values()),
        "lost": sum(r["lost"] for r in results.values()),
        "duplicated": sum(r["duplicated"] for r in results.values()),
        "commit_mode": args.commit_mode,
        "seconds": args.seconds,
        "calls_per_s_per_writer": args.calls_per_s,
        "poll_s": POLL_S,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "sizes": list(results.values()),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
