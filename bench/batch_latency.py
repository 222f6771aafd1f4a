"""Benchmark: the last trajectory of a batch completing -> ``BatchConsumer.next()`` returning it.

Starts what ``claw up`` starts (embedded engine, capture proxy, ``dagster dev`` with the
repository's dagster.yaml and default sensor intervals) in a temporary folder, plays ``claw
demo`` rounds in a second process (real agents through the proxy, trajectories completed with
rule rewards) with ``--pause-s`` between them, as a user runs ``claw demo`` now and then
(``--pause-s 0``: back to back, the two cores saturated by the traffic alone), and consumes the
GRPO batches with a ``BatchConsumer``. For each
batch, the latency is the time ``next()`` returned minus the latest ``created_at`` of its
trajectories' completion events (stamped by the proxy when the last completion arrived; same
machine clock). The first ``--warmup`` batches (Dagster's first runs) are left out.

Where the time goes (medians in ``stages_p50_s``, each in seconds after the last completion,
from Dagster's and the lake's own times): ``run_created`` and ``run_started`` (the run that built
the batch: created by the ingest sensor, started once the run queue launched its process; a
run created before the completion, queued or waiting for its slot, reads it too),
``curated`` (its steps up to ``curated_steps``), ``exported`` (its release wrote the manifest)
and ``returned`` (``next()`` returned: the latency). The bare baseline ``demo_round_s`` (one
demo round, the traffic's own pace) sets the scale.

Prints one JSON object: ``p50_s``, ``p95_s``, ``max_s``, ``batches``, ``latencies_s``,
``stages_p50_s``, ``sensor_interval_s``, ``pause_s``, ``demo_round_s``.

    .venv/bin/python bench/batch_latency.py [--batches 10] [--warmup 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import polars as pl

from claw_pipelines.batches.names import manifest_path
from claw_pipelines.lake import Lake
from claw_pipelines.processes import free_port
from claw_pipelines.settings import LOCAL_MASTER_KEY
from claw_pipelines.stack import CLI, start_dagster, start_engine, start_proxy
from claw_pipelines.trainer import Batch, BatchConsumer

RECIPE = "grpo"


def _traffic(
    proxy_url: str, env: dict[str, str], pause_s: float, stop: threading.Event, rounds: list
) -> None:
    """``claw demo`` rounds until ``stop``; each round's duration goes to ``rounds``."""
    command = [*CLI, "demo", "--proxy-url", proxy_url, "--prompts", "8", "--rollouts", "4"]
    while not stop.is_set():
        started = time.monotonic()
        subprocess.run(command, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False, timeout=600)  # fmt: skip
        rounds.append(time.monotonic() - started)
        stop.wait(pause_s)


def _completed_at(lake: Lake, batch: Batch) -> datetime:
    """When the batch's last trajectory completed (its first completion event)."""
    trajectories = batch.rows.get_column("trajectory_id").unique().implode()
    events = lake.scan("trajectory_events").filter(pl.col("trajectory_id").is_in(trajectories))
    firsts = events.group_by("trajectory_id").agg(pl.col("created_at").min()).collect()
    return firsts.get_column("created_at").max()


RUN_OF_BATCH = """
query Run($partition: String!) {
  assetOrError(assetKey: {path: ["batch_grpo"]}) {
    ... on Asset { assetMaterializations(partitions: [$partition], limit: 1) { runId } }
  }
}
"""
RUN_TIMES = """
query Times($runId: ID!) {
  runOrError(runId: $runId) {
    ... on Run { creationTime startTime stepStats { stepKey endTime } }
  }
}
"""


def _graphql(url: str, query: str, variables: dict) -> dict:
    response = httpx.post(
        f"{url}/graphql", json={"query": query, "variables": variables}, timeout=30
    )
    response.raise_for_status()
    return response.json()["data"]


def _stages(lake: Lake, dagster_url: str, batch: Batch, completed: datetime, returned: datetime):
    """The latency split at the run that built the batch (Dagster's times) and the manifest."""
    found = _graphql(dagster_url, RUN_OF_BATCH, {"partition": batch.batch_id})
    (materialization,) = found["assetOrError"]["assetMaterializations"]
    run = _graphql(dagster_url, RUN_TIMES, {"runId": materialization["runId"]})["runOrError"]
    ends = {step["stepKey"]: step["endTime"] for step in run["stepStats"]}
    created, started = run["creationTime"], run["startTime"]
    curated = ends.get("curated_steps", started)
    manifest = Path(lake.uri(manifest_path(RECIPE, batch.batch_id)))
    exported = manifest.stat().st_mtime
    moments = {"run_created": created, "run_started": started, "curated": curated,
               "exported": exported, "returned": returned.timestamp()}  # fmt: skip
    return {name: moment - completed.timestamp() for name, moment in moments.items()}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    batches: int, warmup: int, workdir: Path, sensor_interval: int | None, pause_s: float
) -> dict:
    lake = Lake(str(workdir / "lake"))
    env = {
        "CLAW_LAKE_URI": lake.root,
        "CLAW_SPOOL_DIR": str(workdir / "spool"),
        "LITELLM_MASTER_KEY": LOCAL_MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    if sensor_interval is not None:
        env["CLAW_DAGSTER_SENSOR_INTERVAL_S"] = str(sensor_interval)
    services = []
    stop, rounds = threading.Event(), []
    try:
        engine = start_engine(free_port(), workdir, env)
        services.append(engine)
        engine.wait_ready("/health", timeout_s=60)
        proxy = start_proxy(free_port(), workdir, f"{engine.url}/v1", env)
        services.append(proxy)
        dagster = start_dagster(free_port(), workdir, env)
        services.append(dagster)
        proxy.wait_ready("/health/liveliness", timeout_s=240)
        dagster.wait_ready("/server_info", timeout_s=240)
        traffic = threading.Thread(target=_traffic, args=(proxy.url, env, pause_s, stop, rounds))
        traffic.start()
        consumer = BatchConsumer(RECIPE, consumer="bench", lake_uri=lake.root)
        latencies, stages = [], []
        for index in range(warmup + batches):
            batch = consumer.next(timeout_s=600)
            returned = datetime.now(UTC)
            if batch is None:
                raise SystemExit(f"no batch within 600 s; logs in {workdir / 'logs'}")
            consumer.ack(batch.batch_id, trainer_step=index)
            completed = _completed_at(lake, batch)
            if index >= warmup:
                latencies.append((returned - completed).total_seconds())
                stages.append(_stages(lake, dagster.url, batch, completed, returned))
            print(f"{batch.batch_id}: {(returned - completed).total_seconds():.1f} s",
                  file=sys.stderr)  # fmt: skip
    finally:
        stop.set()
        for service in reversed(services):
            service.stop(grace_s=5)
    return {
        "p50_s": round(statistics.median(latencies), 2),
        "p95_s": round(_percentile(latencies, 0.95), 2),
        "max_s": round(max(latencies), 2),
        "batches": len(latencies),
        "latencies_s": [round(x, 2) for x in latencies],
        "stages_p50_s": {
            name: round(statistics.median(s[name] for s in stages), 2) for name in stages[0]
        },
        "sensor_interval_s": sensor_interval,
        "pause_s": pause_s,
        "demo_round_s": round(statistics.median(rounds), 2) if rounds else None,
    }


QUICK = {"batches": 1, "warmup": 0, "pause_s": 1.0}
"""``--quick``: one batch of the real stack, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=10, help="batches measured")
    parser.add_argument("--warmup", type=int, default=1, help="first batches left out")
    parser.add_argument(
        "--sensor-interval", type=int, default=None,
        help="CLAW_DAGSTER_SENSOR_INTERVAL_S (default: claw up's own default)",
    )  # fmt: skip
    parser.add_argument("--pause-s", type=float, default=20.0, help="pause between demo rounds")
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    with tempfile.TemporaryDirectory(prefix="claw-latency-") as folder:
        result = measure(
            args.batches, args.warmup, Path(folder), args.sensor_interval, args.pause_s
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
