"""Benchmark: landed turns -> GRPO batch through the Dagster assets, against a bare Delta scan.

Lands N single-step GRPO rollouts (1,024 prompt + 256 response tokens, groups of 4, completion
events with rewards) with ``Lake.append`` in large commits, then, each phase in a fresh process
so its peak RSS is its own:

* ``scan``: ``pl.scan_delta(turns).collect()``, the bare read of the same turns;
* ``write``: a bare ``write_deltalake`` of the turns' token lists (the derived tables' writer
  settings), what any build must add to the read: a batch holding every turn writes them;
* ``build``: steps -> trajectories -> rewarded -> scored -> curated (one in-process Dagster run
  of the real assets) and one batch asset partition holding every group (recipe ``grpo`` with
  ``groups_per_batch`` = all groups);
* ``refresh``: +1 % turns landed, the same assets re-run (they read only the new versions) and
  the next batch planned and written;
* ``floor``: +1 group (4 turns) landed and the same run: the fixed cost every refresh pays
  (Dagster run and step bookkeeping, Delta log reads, commits) whatever the data;
* ``empty``: the same two runs of assets that do nothing (five chained, then one), Dagster's
  own share of that floor.

Prints one JSON object: ``throughput_ratio`` = scan time / build time (goal >= 0.5),
``refresh_ratio`` = refresh time / build time (goal <= 0.05), ``peak_rss_mib`` of the build
(goal <= 2 GiB at 100k turns) and of the refresh (which must not grow with the table).
``bare_read_write_ratio`` = (scan + write) / build compares the build with that bare minimum.
``refresh_work_ratio`` = (refresh - floor) / (build - floor) is the share of the build's
data-dependent work that a +1 % refresh redoes (1 % when work grows with new data only);
``floor_peak_rss_mib`` is the memory of a refresh whose new data does not grow with the table.
The two goals bound each other: (a) wants build <= 2 x scan and (b) refresh <= build / 20, so
meeting both needs refresh <= scan / 10; ``empty_run_seconds`` says how much of that Dagster
alone takes before any asset reads a row.

    .venv/bin/python bench/pipeline.py [--turns 100000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
from deltalake import write_deltalake

from claw_pipelines.derived_schemas import TOKEN_COLUMNS
from claw_pipelines.incremental.increment import WRITER
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import TrajectoryEventRow, Turn

PROMPT_TOKENS = 1024
RESPONSE_TOKENS = 256
GROUP_SIZE = 4
COMMIT_ROWS = 10_000
CHAIN = ["steps", "trajectories", "rewarded_steps", "scored_steps", "curated_steps"]


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


def phase_write(lake: Lake, target: str) -> dict:
    tokens = pl.scan_delta(lake.uri("turns")).select("turn_id", *TOKEN_COLUMNS).collect()
    table = tokens.to_arrow()
    started = time.perf_counter()
    write_deltalake(target, table, writer_properties=WRITER)
    return {"seconds": time.perf_counter() - started, "rows": table.num_rows}


def phase_pipeline(lake: Lake, batch_id: str, groups: int) -> dict:
    """One run of the asset chain, then one batch partition with up to ``groups`` groups."""
    import dagster as dg

    from assets.batches import build_batch_asset
    from assets.definitions import build_definitions
    from claw_pipelines.config_files import recipes
    from resources.lake import LakeResource

    resource_ = LakeResource(lake_uri=lake.root)
    defs = build_definitions(lake=resource_)
    recipe = recipes()["grpo"].model_copy(update={"groups_per_batch": groups})
    batch = build_batch_asset(recipe)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("batches_grpo", [batch_id])
    started = time.perf_counter()
    job = defs.resolve_implicit_job_def_def_for_assets([dg.AssetKey(k) for k in CHAIN])
    chain = job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(k) for k in CHAIN]
    )
    chain_s = time.perf_counter() - started
    result = dg.materialize(
        [batch], instance=instance, resources={"lake": resource_}, partition_key=batch_id
    )
    total_s = time.perf_counter() - started
    (event,) = result.asset_materializations_for_node("batch_grpo")
    return {
        "seconds": total_s,
        "chain_seconds": chain_s,
        "batch_seconds": total_s - chain_s,
        "ok": chain.success and result.success,
        "batch_rows": event.metadata["dagster/partition_row_count"].value,
    }


def phase_empty() -> dict:
    """The bench's two runs (a chain of five assets, then one) with assets that do nothing."""
    import dagster as dg

    def noop(name: str, deps: list[str]) -> dg.AssetsDefinition:
        @dg.asset(name=name, deps=deps)
        def asset():  # no annotation: dagster cannot resolve this module's string annotations
            return dg.MaterializeResult()

        return asset

    chain = [noop(name, CHAIN[i - 1 : i]) for i, name in enumerate(CHAIN)]
    batch = noop("batch_grpo", CHAIN[-1:])
    instance = dg.DagsterInstance.ephemeral()
    started = time.perf_counter()
    ok = dg.materialize(chain, instance=instance).success
    ok = dg.materialize([batch], instance=instance).success and ok
    return {"seconds": time.perf_counter() - started, "ok": ok}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument(
        "--phase", choices=["scan", "write", "pipeline", "empty"], help=argparse.SUPPRESS
    )
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    parser.add_argument("--batch-id", help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        lake = Lake(args.lake)
        phases = {
            "scan": lambda: phase_scan(lake),
            "write": lambda: phase_write(lake, args.target),
            "pipeline": lambda: phase_pipeline(lake, args.batch_id, args.groups),
            "empty": phase_empty,
        }
        measured = phases[args.phase]()
        print(json.dumps({**measured, "peak_rss_mib": round(peak_rss_mib(), 1)}))
        return

    turns = args.turns - args.turns % GROUP_SIZE
    extra = max(GROUP_SIZE, (turns // 100) - (turns // 100) % GROUP_SIZE)
    with tempfile.TemporaryDirectory(prefix="claw-bench-") as root:
        lake = Lake(str(Path(root) / "lake"))
        started = time.perf_counter()
        land(lake, 0, turns, seed=0)
        land_s = time.perf_counter() - started
        scan = run_phase(["--phase", "scan", "--lake", lake.root])
        write = run_phase(
            ["--phase", "write", "--lake", lake.root, "--target", str(Path(root) / "bare")]
        )
        build = run_phase(
            ["--phase", "pipeline", "--lake", lake.root, "--batch-id", "grpo-bench-1",
             "--groups", str(turns // GROUP_SIZE)]
        )  # fmt: skip
        land(lake, turns, extra, seed=1)
        refresh = run_phase(
            ["--phase", "pipeline", "--lake", lake.root, "--batch-id", "grpo-bench-2",
             "--groups", str(extra // GROUP_SIZE)]
        )  # fmt: skip
        land(lake, turns + extra, GROUP_SIZE, seed=2)
        floor = run_phase(
            ["--phase", "pipeline", "--lake", lake.root, "--batch-id", "grpo-bench-3",
             "--groups", "1"]
        )  # fmt: skip
        empty = run_phase(["--phase", "empty", "--lake", lake.root])
    tokens = turns * (PROMPT_TOKENS + RESPONSE_TOKENS)
    print(
        json.dumps(
            {
                "turns": turns,
                "tokens_per_turn": PROMPT_TOKENS + RESPONSE_TOKENS,
                "land_seconds": round(land_s, 2),
                "scan_seconds": round(scan["seconds"], 3),
                "build_seconds": round(build["seconds"], 3),
                "build_chain_seconds": round(build["chain_seconds"], 3),
                "build_batch_seconds": round(build["batch_seconds"], 3),
                "build_batch_rows": build["batch_rows"],
                "steps_per_s": round(turns / build["seconds"], 1),
                "tokens_per_s": round(tokens / build["seconds"]),
                "scan_steps_per_s": round(turns / scan["seconds"], 1),
                "throughput_ratio": round(scan["seconds"] / build["seconds"], 4),
                "write_seconds": round(write["seconds"], 3),
                "bare_read_write_ratio": round(
                    (scan["seconds"] + write["seconds"]) / build["seconds"], 4
                ),
                "refresh_turns": extra,
                "refresh_seconds": round(refresh["seconds"], 3),
                "refresh_batch_rows": refresh["batch_rows"],
                "refresh_ratio": round(refresh["seconds"] / build["seconds"], 4),
                "floor_seconds": round(floor["seconds"], 3),
                "empty_run_seconds": round(empty["seconds"], 3),
                "joint_refresh_budget_seconds": round(scan["seconds"] / 10, 3),
                "refresh_work_ratio": round(
                    (refresh["seconds"] - floor["seconds"]) / (build["seconds"] - floor["seconds"]),
                    4,
                ),
                "peak_rss_mib": build["peak_rss_mib"],
                "refresh_peak_rss_mib": refresh["peak_rss_mib"],
                "floor_peak_rss_mib": floor["peak_rss_mib"],
                "scan_peak_rss_mib": scan["peak_rss_mib"],
                "ok": build["ok"] and refresh["ok"] and floor["ok"] and empty["ok"],
            }
        )
    )


if __name__ == "__main__":
    main()
