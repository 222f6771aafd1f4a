"""Benchmark: landed turns -> GRPO batch through the Dagster assets, against a bare Delta scan.

Lands N single-step GRPO rollouts (1,024 prompt + 256 response tokens, groups of 4, completion
events with rewards) with ``Lake.append`` in large commits, then, each phase in a fresh process
so its peak RSS is its own:

* ``scan``: ``pl.scan_delta(turns).collect()``, the bare read of the same turns;
* ``write``: a bare ``write_deltalake`` of the turns' token lists (the derived tables' writer
  settings), what any build must add to the read: a batch holding every turn writes them; then
  the same lists written as the export writes them (``Destination.parquet_writer``: delta
  encoding and zstd, the encoding that keeps ``token_copies`` <= 2);
* ``build``: one refresh run as the ingest sensor launches it: steps -> trajectories ->
  rewarded -> scored -> curated, then ``release_grpo``, which reserves, writes, checks and
  exports the batch they made ready (recipe ``grpo`` with ``groups_per_batch`` = all groups),
  in process, with the real assets;
* ``refresh``: +1 % turns landed and the same run, ``REFRESH_RUNS`` times (the median counts;
  the assets read only the new versions; the release plans and writes the next batch);
* ``floor``: +1 group (4 turns) landed and the same run, ``FLOOR_RUNS`` times (the median
  counts): the fixed cost every refresh pays (Dagster run and step bookkeeping, Delta log
  reads, commits) whatever the data;
* ``empty``: the same run of assets that do nothing (five chained, then one), Dagster's own
  share of that floor.

Scan, write and build run in ``--rounds`` rounds (default 3), each build on a fresh copy of the
landed lake, so each round's bare phases and build meet the machine in the same state: on the
2-core VMs this runs on, one run's phases swing by up to 2x (page cache, first-touch page faults
on fresh memory), and one round's ratio moved between 0.18 and 0.39 on unchanged code. The
ratios are the medians of the rounds' own ratios; ``rounds`` lists each round.

Prints one JSON object. Goals (issue 19): ``bare_read_write_ratio`` = (scan + write) / build
>= 0.5, the build against the bare I/O any turns -> batch build must do; ``token_copies`` =
bytes of token-list columns in every table and export of the lake / those in ``turns`` <= 2;
``refresh_work_ratio`` = (refresh - floor) / (build - floor) <= 0.05, the share of the build's
data-dependent work that a +1 % refresh redoes (1 % when work grows with new data only);
``floor_seconds`` <= 0.5; ``peak_rss_mib`` of the build <= 2 GiB at 100k turns, and the
refresh's and floor's flat (they must not grow with the table). Also reported:
``throughput_ratio`` = scan / build and ``refresh_ratio`` = refresh / build (goals withdrawn:
they bound each other), ``design_io_ratio`` = (2 x scan + export write) / build, the build
against the I/O this design must do (``steps`` and the export each read the token lists, the
export writes them once in its encoding; no goal: proposed on issue 19 as a restatement of
``bare_read_write_ratio``), ``empty_run_seconds`` (Dagster's own share of the floor),
``*_step_seconds`` (each asset's time in the run) and ``load_average`` (the machine is shared).

    .venv/bin/python bench/pipeline.py [--turns 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import ColumnProperties, DeltaTable, WriterProperties, write_deltalake

from claw_pipelines.derived_schemas import TOKEN_COLUMNS, WRITER
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import TrajectoryEventRow, Turn

PROMPT_TOKENS = 1024
RESPONSE_TOKENS = 256
GROUP_SIZE = 4
COMMIT_ROWS = 10_000
FLOOR_RUNS = 3
"""Floor refreshes, one new group each; the median is reported (one run swings by a third)."""
REFRESH_RUNS = 3
"""+1 % refreshes; the median is reported: ``refresh_work_ratio`` is a difference of two runs,
and one refresh's swing (~0.3 s) moved it by 0.03 of the 0.05 allowed."""
CHAIN = ["steps", "trajectories", "rewarded_steps", "scored_steps", "curated_steps"]
EXPORTS = ["trl"]
"""The export the bench's batch is written in: TRL's rollouts file holds each step's token
lists once, as a trainer reads them. verl's padded int64 tensors of a batch of every turn
would take several GiB in memory (they are built whole), and JSON lines spell the IDs out."""


def _tokens(rng: np.random.Generator, rows: int, width: int) -> pa.ListArray:
    values = pa.array(rng.integers(1, 150_000, rows * width, dtype=np.int32))
    return pa.ListArray.from_arrays(
        pa.array(np.arange(0, rows * width + 1, width, np.int32)), values
    )


def _ids(prefix: str, start: int, rows: int) -> pa.Array:
    return pa.array([f"{prefix}-{i:09d}" for i in range(start, start + rows)])


def land(lake: Lake, first: int, count: int, seed: int, flat_share: float = 0.0) -> None:
    """Land ``count`` one-turn trajectories (in complete groups) and their completion events;
    rewards alternate within a group, except in ``flat_share`` of the groups, where all are 1
    (zero variance)."""
    rng = np.random.default_rng(seed)
    turn_schema, event_schema = Turn.arrow_schema(), TrajectoryEventRow.arrow_schema()
    base = datetime(2026, 11, 30, tzinfo=UTC)
    for start in range(first, first + count, COMMIT_ROWS):
        rows = min(COMMIT_ROWS, first + count - start)
        index = np.arange(start, start + rows)
        trajectories = _ids("t", start, rows)
        groups = pa.array([f"g-{i // GROUP_SIZE:09d}" for i in index])
        started = pa.array(
            [base + timedelta(milliseconds=int(i)) for i in index], pa.timestamp("us", "UTC")
        )
        text = pa.array([f"answer {i % 97}" for i in index])
        columns = {
            "turn_id": _ids("turn", start, rows),
            "trajectory_id": trajectories,
            "group_id": groups,
            "agent": pa.array(["bench"] * rows),
            "policy_version": pa.array(np.ones(rows, np.int64)),
            "model": pa.array(["policy"] * rows),
            "call_type": pa.array(["chat"] * rows),
            "stream": pa.array([False] * rows),
            "status": pa.array(["success"] * rows),
            "finish_reason": pa.array(["stop"] * rows),
            "token_source": pa.array(["engine"] * rows),
            "prompt_token_ids": _tokens(rng, rows, PROMPT_TOKENS),
            "response_token_ids": _tokens(rng, rows, RESPONSE_TOKENS),
            "response_logprobs": pa.ListArray.from_arrays(
                pa.array(np.arange(0, rows * RESPONSE_TOKENS + 1, RESPONSE_TOKENS, np.int32)),
                pa.array(np.full(rows * RESPONSE_TOKENS, -0.5, np.float32)),
            ),
            "request_messages": pa.array(['[{"role": "user", "content": "solve"}]'] * rows),
            "response_message": pa.array(
                [f'{{"role": "assistant", "content": "{t}"}}' for t in text.to_pylist()]
            ),
            "response_text": text,
            "prompt_tokens": pa.array(np.full(rows, PROMPT_TOKENS, np.int32)),
            "completion_tokens": pa.array(np.full(rows, RESPONSE_TOKENS, np.int32)),
            "started_at": started,
            "ended_at": started,
        }
        turns = pa.table(
            {f.name: columns.get(f.name, pa.nulls(rows, f.type)) for f in turn_schema}
        ).cast(turn_schema)
        lake.append("turns", turns)
        events = {
            "event_id": _ids("e", start, rows),
            "trajectory_id": trajectories,
            "group_id": groups,
            "event": pa.array(["completed"] * rows),
            "reward": pa.array(
                np.where((index // GROUP_SIZE) % 100 < flat_share * 100, 1.0, index % 2)
            ),
            "created_at": started,
        }
        lake.append(
            "trajectory_events",
            pa.table(
                {f.name: events.get(f.name, pa.nulls(rows, f.type)) for f in event_schema}
            ).cast(event_schema),
        )


def peak_rss_mib() -> float:
    """This process's own peak RSS. Not ``getrusage``: a child started by ``subprocess`` (vfork
    + exec) inherits its parent's peak in ``ru_maxrss``, so every phase would report at least
    the memory of the process that landed the turns."""
    status = Path("/proc/self/status")
    if status.exists():
        (line,) = [x for x in status.read_text().splitlines() if x.startswith("VmHWM:")]
        return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def phase_scan(lake: Lake) -> dict:
    started = time.perf_counter()
    frame = pl.scan_delta(lake.uri("turns")).collect()
    return {"seconds": time.perf_counter() - started, "rows": frame.height}


def _encodings() -> dict[str, WriterProperties | None]:
    """Writer settings to compare on the same token lists (``phase_write``)."""
    plain = ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
    dictionary = ColumnProperties(dictionary_enabled=True, statistics_enabled="NONE")
    return {
        "lake (plain, zstd level 1)": WRITER,
        "dictionary, snappy": WriterProperties(default_column_properties=dictionary),
        "plain, zstd": WriterProperties(default_column_properties=plain, compression="ZSTD"),
        "dictionary, zstd": WriterProperties(
            default_column_properties=dictionary, compression="ZSTD"
        ),
        "delta-rs defaults (dictionary, snappy)": None,
    }


def phase_write(lake: Lake, target: str, compare: bool) -> dict:
    """The bare write of the token lists with the derived tables' settings (timed); with
    ``compare`` then the same rows with each of ``_encodings`` and as the TRL export writes them
    (pyarrow's defaults): seconds and token-list bytes of each."""
    tokens = pl.scan_delta(lake.uri("turns")).select("turn_id", *TOKEN_COLUMNS).collect()
    table = tokens.to_arrow()
    started = time.perf_counter()
    write_deltalake(target, table, writer_properties=WRITER)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    Destination(f"{target}-export").arrow_parquet(table, "tokens.parquet")
    written = {
        "seconds": seconds,
        "export_seconds": time.perf_counter() - started,
        "rows": table.num_rows,
    }
    if not compare:
        return written
    encodings = {}
    for index, (name, properties) in enumerate(_encodings().items()):
        folder = f"{target}-{index}"
        began = time.perf_counter()
        write_deltalake(folder, table, writer_properties=properties)
        took = time.perf_counter() - began
        files = DeltaTable(folder).file_uris()
        encodings[name] = {"seconds": round(took, 3), "bytes": sum(map(_list_column_bytes, files))}
    began = time.perf_counter()
    pq.write_table(table, f"{target}-export.parquet")
    encodings["export (pyarrow defaults)"] = {
        "seconds": round(time.perf_counter() - began, 3),
        "bytes": _list_column_bytes(f"{target}-export.parquet"),
    }
    return {**written, "encodings": encodings}


def _step_windows(instance, run_id: str) -> dict[str, tuple[float, float]]:
    """Each step's start and success times in the run, from its events."""
    import dagster as dg

    started: dict[str, float] = {}
    windows: dict[str, tuple[float, float]] = {}
    for entry in instance.all_logs(run_id):
        kind, key = entry.dagster_event_type, entry.step_key
        if kind == dg.DagsterEventType.STEP_START:
            started[key] = entry.timestamp
        elif kind == dg.DagsterEventType.STEP_SUCCESS and key in started:
            windows[key] = (started[key], entry.timestamp)
    return windows


class RssSampler:
    """This process's RSS (``VmRSS``) every ``interval_s`` on a thread, so a phase's peak can be
    told from the process's (``VmHWM`` only knows the whole run's). tracemalloc does not see
    polars' and Arrow's Rust allocations; the kernel's count does."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        status = Path("/proc/self/status")
        while not self._stop.is_set():
            (line,) = [x for x in status.read_text().splitlines() if x.startswith("VmRSS:")]
            self.samples.append((time.time(), int(line.split()[1]) * 1024))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def peak_mib(self, start: float, end: float) -> float | None:
        """The highest RSS sampled between ``start`` and ``end`` (seconds since the epoch)."""
        within = [rss for at, rss in self.samples if start <= at <= end]
        return round(max(within) / 2**20, 1) if within else None


def phase_pipeline(lake: Lake, groups: int) -> dict:
    """One refresh run as the ingest sensor launches it (``assets.landing.REFRESH``): the
    asset chain, then ``release_grpo``, which reserves, writes, checks and exports the batch
    it made ready (recipe ``grpo`` with up to ``groups`` groups, exported as ``EXPORTS``).
    The batch's rows point at their turns, so the export is where the build writes the token
    lists, and a build without it would not be turns -> trainer."""
    import dagster as dg

    from assets.definitions import build_definitions
    from claw_pipelines import config_files
    from resources.lake import LakeResource

    recipe = config_files.recipes()["grpo"]
    config_files.recipes()["grpo"] = recipe.model_copy(
        update={"groups_per_batch": groups, "exports": EXPORTS}
    )  # the release asset is built from the shipped recipes: this process's grpo is the bench's
    resource_ = LakeResource(lake_uri=lake.root)
    defs = build_definitions(lake=resource_)
    selection = [dg.AssetKey(key) for key in [*CHAIN, "release_grpo"]]
    job = defs.resolve_implicit_job_def_def_for_assets(selection)
    instance = dg.DagsterInstance.ephemeral()
    started = time.perf_counter()
    with RssSampler() as rss:
        result = job.execute_in_process(instance=instance, asset_selection=selection)
    seconds = time.perf_counter() - started
    windows = _step_windows(instance, result.run_id)
    logged = result.asset_materializations_for_node("release_grpo")
    (batch,) = [m for m in logged if m.asset_key == dg.AssetKey("batch_grpo")]
    (exported,) = [m for m in logged if m.asset_key == dg.AssetKey("export_grpo")]
    return {
        "seconds": seconds,
        "steps": {key: round(end - start, 3) for key, (start, end) in windows.items()},
        "steps_peak_rss_mib": {key: rss.peak_mib(*window) for key, window in windows.items()},
        "ok": result.success,
        "batch_rows": batch.metadata["dagster/partition_row_count"].value,
        "export_rows": exported.metadata["dagster/partition_row_count"].value,
    }


def phase_empty() -> dict:
    """The bench's refresh run (a chain of five assets, then a release) with assets that do
    nothing."""
    import dagster as dg

    def noop(name: str, deps: list[str]) -> dg.AssetsDefinition:
        @dg.asset(name=name, deps=deps)
        def asset():  # no annotation: dagster cannot resolve this module's string annotations
            return dg.MaterializeResult()

        return asset

    names = [*CHAIN, "release_grpo"]
    assets = [noop(name, names[i - 1 : i]) for i, name in enumerate(names)]
    instance = dg.DagsterInstance.ephemeral()
    started = time.perf_counter()
    ok = dg.materialize(assets, instance=instance).success
    return {"seconds": time.perf_counter() - started, "ok": ok}


def _list_column_bytes(path: str) -> int:
    """Compressed bytes of the numeric columns inside lists of one Parquet file."""
    metadata = pq.ParquetFile(path).metadata
    numeric = {"INT32", "INT64", "FLOAT", "DOUBLE"}
    return sum(
        chunk.total_compressed_size
        for group in range(metadata.num_row_groups)
        for chunk in (metadata.row_group(group).column(i) for i in range(metadata.num_columns))
        if chunk.physical_type in numeric and ".list." in f".{chunk.path_in_schema}."
    )


def token_bytes(root: Path) -> dict[str, int]:
    """Bytes of token-list columns per Delta table and per export folder under the lake root:
    every numeric list column (token IDs, logprobs; in exports also masks and positions) of
    each table's current files (files removed by a later commit wait for a vacuum and are not
    counted), of every Parquet file of an export, and JSON lines files whole."""
    found: dict[str, int] = {}
    tables = sorted({log.parent for log in root.rglob("_delta_log")})
    for table in tables:
        files = DeltaTable(str(table)).file_uris()
        found[str(table.relative_to(root))] = sum(_list_column_bytes(f) for f in files)
    for path in sorted(root.rglob("*")):
        inside = any(table in path.parents for table in tables)
        if inside or path.suffix not in (".parquet", ".jsonl"):
            continue
        folder = "/".join(path.relative_to(root).parts[:2])
        size = _list_column_bytes(str(path)) if path.suffix == ".parquet" else path.stat().st_size
        found[folder] = found.get(folder, 0) + size
    return {name: size for name, size in found.items() if size}


def flat_groups(groups: int, flat_share: float) -> int:
    """How many of the first ``groups`` groups ``land`` makes zero-variance."""
    return int((np.arange(groups) % 100 < flat_share * 100).sum())


def run_phase(args: list[str], script: str = __file__) -> dict:
    """Run one phase of ``script`` in a fresh interpreter and add its peak RSS."""
    done = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"phase {args} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _middle(runs: list[dict]) -> dict:
    """The run of median seconds (the upper one of an even count)."""
    return sorted(runs, key=lambda run: run["seconds"])[len(runs) // 2]


def measure_rounds(lake: Lake, root: Path, turns: int, rounds: int) -> tuple[list[dict], Lake]:
    """``rounds`` rounds of scan, write and build (each build on a fresh copy of ``lake``, as
    landed); the lake the last build left, for the refresh and floor."""
    measured, built = [], lake
    for index in range(rounds):
        scan = run_phase(["--phase", "scan", "--lake", lake.root])
        target = root / f"bare-{index}"
        write_args = ["--phase", "write", "--lake", lake.root, "--target", str(target)]
        write = run_phase(write_args + (["--compare"] if index == 0 else []))
        shutil.rmtree(target)
        shutil.rmtree(f"{target}-export")
        copy = root / f"built-{index}"
        shutil.copytree(lake.root, copy)
        built = Lake(str(copy))
        build = run_phase(
            ["--phase", "pipeline", "--lake", built.root, "--groups", str(turns // GROUP_SIZE)]
        )  # fmt: skip
        if index < rounds - 1:
            shutil.rmtree(copy)
        measured.append({"scan": scan, "write": write, "build": build})
    return measured, built


QUICK = {"turns": 800, "rounds": 1, "refresh_runs": 1, "floor_runs": 1}
"""``--quick``: every phase once on a tiny lake, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--phase", choices=["scan", "write", "pipeline", "empty"], help=argparse.SUPPRESS
    )
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--compare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--refresh-runs", type=int, default=REFRESH_RUNS)
    parser.add_argument("--floor-runs", type=int, default=FLOOR_RUNS)
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    if args.phase:
        lake = Lake(args.lake)
        phases = {
            "scan": lambda: phase_scan(lake),
            "write": lambda: phase_write(lake, args.target, args.compare),
            "pipeline": lambda: phase_pipeline(lake, args.groups),
            "empty": phase_empty,
        }
        measured = phases[args.phase]()
        print(json.dumps({**measured, "peak_rss_mib": round(peak_rss_mib(), 1)}))
        return

    turns = args.turns - args.turns % GROUP_SIZE
    extra = max(GROUP_SIZE, (turns // 100) - (turns // 100) % GROUP_SIZE)
    with tempfile.TemporaryDirectory(prefix="claw-bench-") as root:
        landed = Lake(str(Path(root) / "lake"))
        started = time.perf_counter()
        land(landed, 0, turns, seed=0)
        land_s = time.perf_counter() - started
        rounds, lake = measure_rounds(landed, Path(root), turns, max(1, args.rounds))
        refreshes, floors = [], []
        for index in range(args.refresh_runs):
            land(lake, turns + index * extra, extra, seed=1 + index)
            refreshes.append(
                run_phase(["--phase", "pipeline", "--lake", lake.root,
                           "--groups", str(extra // GROUP_SIZE)])
            )  # fmt: skip
        refresh = _middle(refreshes)
        landed_turns = turns + args.refresh_runs * extra
        for index in range(args.floor_runs):
            seed = 1 + args.refresh_runs + index
            land(lake, landed_turns + index * GROUP_SIZE, GROUP_SIZE, seed=seed)
            floors.append(run_phase(["--phase", "pipeline", "--lake", lake.root, "--groups", "1"]))
        floor = _middle(floors)
        empty = run_phase(["--phase", "empty", "--lake", lake.root])
        stored = token_bytes(Path(lake.root))
    scans = [r["scan"]["seconds"] for r in rounds]
    writes = [r["write"]["seconds"] for r in rounds]
    builds = [r["build"]["seconds"] for r in rounds]
    exports = [r["write"]["export_seconds"] for r in rounds]
    build_s = _median(builds)
    middle = _middle([r["build"] for r in rounds])
    tokens = turns * (PROMPT_TOKENS + RESPONSE_TOKENS)
    print(
        json.dumps(
            {
                "turns": turns,
                "tokens_per_turn": PROMPT_TOKENS + RESPONSE_TOKENS,
                "land_seconds": round(land_s, 2),
                "scan_seconds": round(_median(scans), 3),
                "build_seconds": round(build_s, 3),
                "build_step_seconds": {
                    step: round(_median([r["build"]["steps"][step] for r in rounds]), 3)
                    for step in middle["steps"]
                },
                "build_batch_rows": middle["batch_rows"],
                "steps_per_s": round(turns / build_s, 1),
                "tokens_per_s": round(tokens / build_s),
                "scan_steps_per_s": round(turns / _median(scans), 1),
                "throughput_ratio": round(
                    _median([s / b for s, b in zip(scans, builds, strict=True)]), 4
                ),
                "write_seconds": round(_median(writes), 3),
                "bare_read_write_ratio": round(
                    _median([(s + w) / b for s, w, b in zip(scans, writes, builds, strict=True)]), 4
                ),
                "export_write_seconds": round(_median(exports), 3),
                "design_io_ratio": round(
                    _median(
                        [(2 * s + e) / b for s, e, b in zip(scans, exports, builds, strict=True)]
                    ),
                    4,
                ),
                "rounds": [
                    {
                        "scan_seconds": round(s, 3),
                        "write_seconds": round(w, 3),
                        "export_write_seconds": round(e, 3),
                        "build_seconds": round(b, 3),
                        "bare_read_write_ratio": round((s + w) / b, 4),
                        "design_io_ratio": round((2 * s + e) / b, 4),
                    }
                    for s, w, e, b in zip(scans, writes, exports, builds, strict=True)
                ],
                "refresh_turns": extra,
                "refresh_seconds": round(refresh["seconds"], 3),
                "refresh_runs_seconds": [round(run["seconds"], 3) for run in refreshes],
                "refresh_batch_rows": refresh["batch_rows"],
                "refresh_ratio": round(refresh["seconds"] / build_s, 4),
                "floor_seconds": round(floor["seconds"], 3),
                "floor_runs_seconds": [round(run["seconds"], 3) for run in floors],
                "floor_step_seconds": floor["steps"],
                "empty_run_seconds": round(empty["seconds"], 3),
                "joint_refresh_budget_seconds": round(_median(scans) / 10, 3),
                "refresh_work_ratio": round(
                    (refresh["seconds"] - floor["seconds"]) / (build_s - floor["seconds"]), 4
                ),
                "token_copies": round(sum(stored.values()) / stored["turns"], 3),
                "token_copies_in_tables": round(
                    sum(v for k, v in stored.items() if not k.startswith("exports/"))
                    / stored["turns"],
                    3,
                ),
                "token_bytes": stored,
                "encodings": rounds[0]["write"]["encodings"],
                "peak_rss_mib": max(r["build"]["peak_rss_mib"] for r in rounds),
                "refresh_peak_rss_mib": max(run["peak_rss_mib"] for run in refreshes),
                "floor_peak_rss_mib": floor["peak_rss_mib"],
                "scan_peak_rss_mib": max(r["scan"]["peak_rss_mib"] for r in rounds),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "ok": all(r["build"]["ok"] for r in rounds)
                and all(run["ok"] for run in refreshes)
                and all(run["ok"] for run in floors)
                and empty["ok"],
            }
        )
    )


if __name__ == "__main__":
    main()
