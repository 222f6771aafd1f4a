"""The code location loads (from Python and the CLIs) and its graph reads as the lifecycle."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from assets.definitions import defs
from claw_pipelines.settings import ClawSettings, get_settings
from resources.lake import LakeResource

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

GROUPS = {
    "turns": "landing",
    "rewards": "landing",
    "trajectory_events": "landing",
    "trajectory_registrations": "landing",
    "labels": "landing",
    "steps": "steps",
    "trajectories": "steps",
    "rewarded_steps": "rewards",
    "scored_steps": "quality",
    "curated_steps": "curation",
    "batch_grpo": "batches",
    "export_grpo": "exports",
}


def test_definitions_load_and_read_as_the_lifecycle() -> None:
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    for key, group in GROUPS.items():
        node = graph.get(dg.AssetKey(key))
        assert node.group_name == group, key
        assert "team:rl-data" in node.owners, key
        assert node.description, key
    assert dg.AssetKey("labels") in graph.get(dg.AssetKey("curated_steps")).parent_keys
    assert graph.get(dg.AssetKey("batch_grpo")).parent_keys == {dg.AssetKey("curated_steps")}
    sensors = {s.name: s for s in defs.sensors}
    assert {"landing_ingest_sensor", "claw_automation_sensor", "batch_grpo_planner"} <= set(sensors)
    assert all(s.default_status == dg.DefaultSensorStatus.RUNNING for s in sensors.values())


def test_the_vacuum_knows_every_reader_of_each_landing_table() -> None:
    """``LANDING_READERS`` (whose watermarks the vacuum keeps) names the assets that depend on
    each landing table: a new reader left out would have its unread versions vacuumed."""
    from assets.landing import LANDING_TABLES
    from claw_pipelines.maintenance import LANDING_READERS

    graph = defs.resolve_asset_graph()
    for table in LANDING_TABLES:
        children = {key.to_user_string() for key in graph.get(dg.AssetKey(table)).child_keys}
        assert children == set(LANDING_READERS[table]), table


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["dagster", "definitions", "validate", "-w", "workspace.yaml"], "passed validation"),
        (["dg", "check", "defs"], "All definitions loaded successfully"),
    ],
    ids=["dagster-definitions-validate", "dg-check-defs"],
)
def test_workspace_validates_from_the_cli(tmp_path: Path, command: list[str], says: str) -> None:
    (tmp_path / "dagster.yaml").write_text("")
    done = subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        cwd=REPO,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path), "CLAW_LAKE_URI": str(tmp_path / "l")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert says in done.stderr + done.stdout


def test_a_process_loading_the_code_location_freezes_what_loading_allocated(
    tmp_path: Path,
) -> None:
    """Run workers and the code server keep the loaded definitions for life: frozen, they are
    not walked again by each full garbage collection (one cost a refresh run 0.14-0.18 s)."""
    done = subprocess.run(
        [sys.executable, "-c", "import gc, assets.definitions; print(gc.get_freeze_count())"],
        cwd=REPO,
        env={**os.environ, "CLAW_LAKE_URI": str(tmp_path / "lake")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 100_000  # ~160k objects: dagster, polars, our assets


def test_lake_resource_keeps_secrets_out_of_config(monkeypatch) -> None:
    options = {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    monkeypatch.setenv("CLAW_STORAGE_OPTIONS", json.dumps(options))
    get_settings.cache_clear()
    try:
        resource = LakeResource.from_settings(
            ClawSettings(lake_uri="s3://bucket/lake", storage_options=options)
        )
        assert resource.storage_options == {"AWS_REGION": "eu-west-1"}
        assert "s3cr3t" not in resource.model_dump_json()
        lake = resource.lake()
    finally:
        get_settings.cache_clear()
    assert lake.storage_options == {**options, "conditional_put": "etag"}  # safe S3 commits
    assert lake.uri("batches/grpo") == "s3://bucket/lake/batches/grpo"
    local = LakeResource.from_settings(ClawSettings(lake_uri="relative/lake"))
    assert Path(local.lake_uri).is_absolute()


def test_dagster_dev_in_the_repository_gives_each_derived_table_one_writer(monkeypatch) -> None:
    """`dagster dev -w workspace.yaml` run here without $DAGSTER_HOME takes the repository's
    dagster.yaml (Dagster's own lookup, as the CLI does it): one run per pool at a time, and
    run monitoring, so a run whose process died is failed instead of staying STARTING."""
    from dagster._cli.utils import get_possibly_temporary_instance_for_cli
    from dagster._core.run_coordinator import QueuedRunCoordinator

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(REPO)
    with get_possibly_temporary_instance_for_cli("dagster dev") as instance:
        assert instance.global_op_concurrency_default_limit == 1
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        assert instance.run_monitoring_enabled  # a run that died is failed


def test_a_run_killed_holding_a_pool_slot_gives_it_back(monkeypatch) -> None:
    """A run worker killed mid-step (kill -9, OOM) never releases its pool slot; run monitoring
    fails the run, and the repository's dagster.yaml has the daemon free a failed run's slots
    afterwards. Otherwise every later run of that table (every later batch of a recipe) stays
    queued for good."""
    from types import SimpleNamespace

    from dagster._cli.utils import get_possibly_temporary_instance_for_cli
    from dagster._daemon.monitoring import concurrency

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(REPO)
    with get_possibly_temporary_instance_for_cli("dagster dev") as instance:
        killed = instance.create_run_for_job(
            dg.GraphDefinition(name="batch").to_job(), status=dg.DagsterRunStatus.STARTED
        )
        slots = instance.event_log_storage
        slots.initialize_concurrency_limit_to_default("claw_batch_grpo")
        assert slots.claim_concurrency_slot(
            "claw_batch_grpo", killed.run_id, "batch_grpo"
        ).is_claimed
        instance.report_run_failed(killed)  # what run monitoring does for the dead worker
        a_day_later = concurrency.get_current_datetime() + timedelta(days=1)
        monkeypatch.setattr(concurrency, "get_current_datetime", lambda: a_day_later)
        context = SimpleNamespace(instance=instance)
        list(concurrency.execute_concurrency_slots_iteration(context, logging.getLogger()))
        assert slots.get_concurrency_info("claw_batch_grpo").claimed_slots == []
