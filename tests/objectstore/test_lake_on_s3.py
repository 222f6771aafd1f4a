"""The whole path on an S3 lake: agents through a capture proxy, the Dagster chain to an SFT
batch and its export, a trainer taking and acking it, and the inspector reading and curating."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import pyarrow.parquet as pq
import pytest
from dagster_harness import Bound, Driver
from deltalake.fs import DeltaStorageHandler
from pyarrow.fs import PyFileSystem
from s3_lake import S3, Fleet, lake_env

from claw_pipelines.batches.names import exports_folder, manifest_path
from claw_pipelines.batches.rows import batch_rows
from claw_pipelines.demo import AGENT, run_demo
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.processes import free_port, start_service
from claw_pipelines.schemas import utc_now
from claw_pipelines.settings import get_settings
from claw_pipelines.trainer import BatchConsumer
from resources.lake import LakeResource

SFT_BATCH = 8
"""Trajectories of an sft batch (assets/batches.yaml): successful ones, reward 1."""
MAX_ROUNDS = 4


def _play_until_an_sft_batch(fleet: Fleet) -> set[str]:
    """Demo rounds through the first proxy until enough trajectories succeeded; their ids."""
    started, turns, successes = utc_now(), 0, 0
    for _ in range(MAX_ROUNDS):
        summary = run_demo(
            prompts=8,
            rollouts=2,
            proxy_url=fleet.proxies[0].url,
            concurrency=8,
            key=fleet.key,
            lake=fleet.lake,
        )
        assert summary.errors == 0
        turns += summary.turns
        successes += sum(r >= 1.0 for r in summary.rewards)
        if successes >= SFT_BATCH:
            break
    assert successes >= SFT_BATCH, f"{successes} successful trajectories in {MAX_ROUNDS} rounds"
    ours = pl.col("agent").eq(AGENT) & pl.col("started_at").ge(started)
    rows = _wait(
        lambda: _rows(fleet, "turns"), lambda f: not f.is_empty() and f.filter(ours).height >= turns
    )
    landed = rows.filter(ours) if not rows.is_empty() else rows
    assert landed.height == turns
    trajectories = set(landed["trajectory_id"])
    _wait(
        lambda: _rows(fleet, "trajectory_events"),
        lambda f: not f.is_empty() and trajectories <= set(f["trajectory_id"]),
    )
    return trajectories


def _rows(fleet: Fleet, table: str) -> pl.DataFrame:
    scan = fleet.lake.scan(table)
    return pl.DataFrame() if scan is None else scan.collect()


def _wait(read, done, timeout_s: float = 90):
    """Poll ``read()`` until ``done`` holds for what it read (flushes are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while not done(rows := read()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return rows


def test_proxy_to_trainer_on_an_s3_lake(
    fleet: Fleet, s3: S3, lake_settings, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    lake = fleet.lake
    trajectories = _play_until_an_sft_batch(fleet)

    lake_settings(lake.root, s3.options())  # Dagster's resource takes secrets from settings
    driver = Driver(Bound.over(LakeResource.from_settings(get_settings())), instance)
    driver.refresh()
    planned = driver.tick("batch_sft_planner")
    assert isinstance(planned, dg.SensorResult), planned
    batch_ids = [request.partition_key for request in planned.run_requests]
    assert batch_ids
    for batch_id in batch_ids:
        driver.materialize(["batch_sft", "export_sft"], partition_key=batch_id)

    rows = pl.concat(batch_rows(lake, "sft", "sft", batch_id) for batch_id in batch_ids)
    landed = _rows(fleet, "turns").select("turn_id", "prompt_token_ids", "response_token_ids")
    joined = rows.join(landed, on="turn_id", suffix="_landed")
    assert joined.height == rows.height > 0
    assert joined["response_token_ids"].to_list() == joined["response_token_ids_landed"].to_list()
    assert set(rows["trajectory_id"]) <= trajectories

    first = batch_ids[0]
    assert lake.files_exist([manifest_path("sft", first)]) == [True]
    export = lake.uri(f"{exports_folder('sft')}/{first}")
    sequences = pl.read_ndjson(
        f"{export}/jsonl/sequences.jsonl", storage_options=lake.storage_options
    )  # the shipped sft recipe: one row per segment of a trajectory
    segments = rows.filter(pl.col("batch_id") == first).select("trajectory_id", "segment_index")
    assert sequences.height == segments.n_unique()
    store = PyFileSystem(DeltaStorageHandler(export, lake.storage_options))
    assert pq.read_table("trl/sft_messages.parquet", filesystem=store).num_rows > 0

    consumer = BatchConsumer("sft", "s3-trainer", lake.root, storage_options=s3.options())
    batch = consumer.next(timeout_s=60)
    assert batch is not None and batch.batch_id in batch_ids
    assert len(batch.to_trl("sft_messages")) == batch.rows["trajectory_id"].n_unique()
    consumer.ack(batch.batch_id, trainer_step=1)
    resumed = BatchConsumer("sft", "s3-trainer", lake.root, storage_options=s3.options())
    again = resumed.next(timeout_s=2)
    assert again is None or again.batch_id != batch.batch_id

    _inspector_reads_and_curates(fleet, sorted(trajectories)[0], tmp_path)


def _inspector_reads_and_curates(fleet: Fleet, trajectory_id: str, tmp_path: Path) -> None:
    port = free_port()
    inspector = start_service(
        "inspector",
        [sys.executable, "-m", "claw_pipelines.cli", "inspect", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        tmp_path / "inspector.log",
        env=lake_env(fleet.lake.root, fleet.lake.storage_options),
    )
    try:
        inspector.wait_ready("/api/health", timeout_s=90)
        summary = httpx.get(f"{inspector.url}/api/trajectories/{trajectory_id}/summary")
        assert summary.status_code == 200, summary.text
        label = {"target_kind": "trajectory", "target_ids": [trajectory_id]}
        label |= {"trainable": False, "author": "s3-test"}
        written = httpx.post(f"{inspector.url}/api/labels", json=label, timeout=60)
        assert written.status_code == 200, written.text
    finally:
        inspector.stop()
    labels = _rows(fleet, "labels").filter(pl.col("target_id") == trajectory_id)
    assert labels["trainable"].to_list() == [False]


def test_polars_exports_reach_s3_with_the_lake_options(s3: S3) -> None:
    """The verl files are written by polars' own object store, not delta-rs's."""
    lake = s3.new_lake()
    out = Destination(lake.uri("exports/grpo/b1"), lake.storage_options)
    frame = pl.DataFrame({"input_ids": [[1, 2, 3], [4, 5, 6]]})
    out.parquet(frame, "verl/batch.parquet")
    written = pl.read_parquet(out.uri("verl/batch.parquet"), storage_options=lake.storage_options)
    assert written.equals(frame)


@pytest.fixture
def instance():
    with dg.instance_for_test() as test_instance:
        yield test_instance
