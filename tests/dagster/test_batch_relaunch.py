"""Reserved batches whose run was lost: the planner reserved the steps and asked for a run that
never ran (Dagster stopped with it queued, or restarted on a temporary instance) or failed. The
relauncher runs them again, once their run is surely not on its way, and not forever."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.storage.tags import WILL_RETRY_TAG
from dagster_harness import Driver
from dagster_rollouts import land_rollouts

from assets import batches
from claw_pipelines.batching import ledger
from claw_pipelines.batching import release as batch_release
from claw_pipelines.config_files import recipes
from claw_pipelines.schemas import utc_now

RELAUNCHER = "batch_grpo_relauncher"


def _reserved_and_lost(bound, instance) -> tuple[Driver, dg.RunRequest]:
    """Four complete GRPO groups; the planner reserves one batch and asks for its run, which is
    never run."""
    driver = Driver(bound, instance)
    land_rollouts(bound.lake, groups=4, group_size=4, steps=1)
    driver.refresh()
    (request,) = driver.tick("batch_grpo_planner").run_requests
    return driver, request


def _later(monkeypatch, seconds: float) -> None:
    """The sensors' clock moves ``seconds`` ahead."""
    monkeypatch.setattr(batches, "utc_now", lambda: utc_now() + timedelta(seconds=seconds))


def _past_the_grace_period(monkeypatch) -> None:
    _later(monkeypatch, batches.RELAUNCH_AFTER_S + 1)


def _selected(request: dg.RunRequest) -> list[str]:
    return [key.to_user_string() for key in request.asset_selection]


def _run_of(driver: Driver, batch_id: str, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    """A run of the batch and its export for ``batch_id`` in ``status``, as the daemon creates
    the planner's (with the code location it came from, which a queued run needs)."""
    keys = {dg.AssetKey("batch_grpo"), dg.AssetKey("export_grpo")}
    job = driver.bound.defs.resolve_implicit_job_def_def_for_assets(list(keys))
    location = RegisteredCodeLocationOrigin("claw_pipelines")
    return driver.instance.create_run_for_job(
        job,
        status=status,
        tags={batches.PARTITION_TAG: batch_id},
        asset_selection=keys,
        remote_job_origin=RemoteJobOrigin(
            RemoteRepositoryOrigin(location, "__repository__"), job.name
        ),
    )


def test_a_batch_reserved_before_a_restart_on_a_temporary_instance_is_relaunched_as_planned(
    bound, instance, monkeypatch
) -> None:
    """The new instance has neither the run nor its run key, the lake has the reservation: the
    batch is launched again, with its export, and writes exactly the steps it reserved."""
    _, lost = _reserved_and_lost(bound, instance)
    batch_id = lost.partition_key
    _past_the_grace_period(monkeypatch)
    with dg.instance_for_test() as temporary:
        restarted = Driver(bound, temporary)
        (again,) = restarted.tick(RELAUNCHER).run_requests
        assert again.partition_key == batch_id and again.run_key != lost.run_key
        assert _selected(again) == _selected(lost)
        restarted.materialize(_selected(again), partition_key=batch_id)
        assert isinstance(restarted.tick(RELAUNCHER), dg.SkipReason)
    written = bound.lake.scan("batches/grpo").filter(pl.col("batch_id") == batch_id).collect()
    pins = ledger.pins_of(bound.lake, "grpo", batch_id)
    plan = ledger.plan_from_pins(bound.lake, recipes()["grpo"], batch_id, pins)
    assert written.height == plan.planned.height == 16
    reserved = ledger.consumed_turns(bound.lake, "grpo", batch_id)
    assert sorted(written["turn_id"]) == sorted(plan.planned["turn_id"]) == reserved


def test_a_batch_written_but_not_exported_before_a_restart_is_exported(
    bound, instance, monkeypatch
) -> None:
    """The stack stopped between a run's batch step and its export: the rows are in the lake,
    the manifest is not, and a temporary instance has no materialization that automation would
    export after. The relauncher launches the export alone, which writes the manifest."""
    driver, lost = _reserved_and_lost(bound, instance)
    batch_id = lost.partition_key
    driver.materialize(["batch_grpo"], partition_key=batch_id)
    _past_the_grace_period(monkeypatch)
    with dg.instance_for_test() as temporary:
        restarted = Driver(bound, temporary)
        (again,) = restarted.tick(RELAUNCHER).run_requests
        assert again.partition_key == batch_id and _selected(again) == ["export_grpo"]
        restarted.materialize(_selected(again), partition_key=batch_id)
        assert isinstance(restarted.tick(RELAUNCHER), dg.SkipReason)
    assert ledger.exported_batches(bound.lake, "grpo", [batch_id, "grpo-999999"]) == {batch_id}


def test_the_relauncher_checks_only_the_reservations_since_the_oldest_unfinished(
    bound, instance, monkeypatch
) -> None:
    """Its cursor moves past finished batches, so a tick's cost follows the backlog, not the
    ledger: a manifest lost later is not looked for again, except by a fresh instance."""
    driver, lost = _reserved_and_lost(bound, instance)
    batch_id = lost.partition_key
    _past_the_grace_period(monkeypatch)
    (again,) = driver.tick(RELAUNCHER).run_requests
    driver.materialize(_selected(again), partition_key=batch_id)
    assert isinstance(driver.tick(RELAUNCHER), dg.SkipReason)
    (Path(bound.lake.uri(f"exports/grpo/{batch_id}")) / "manifest.json").unlink()
    assert isinstance(driver.tick(RELAUNCHER), dg.SkipReason)
    (export,) = Driver(bound, instance).tick(RELAUNCHER).run_requests
    assert export.partition_key == batch_id and _selected(export) == ["export_grpo"]


@pytest.mark.parametrize(
    "status",
    [
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
    ],
)
def test_a_batch_with_a_run_to_come_is_not_relaunched(
    bound, instance, monkeypatch, status: dg.DagsterRunStatus
) -> None:
    driver, lost = _reserved_and_lost(bound, instance)
    assert _run_of(driver, lost.partition_key, status).status == status
    _past_the_grace_period(monkeypatch)
    assert isinstance(driver.tick(RELAUNCHER), dg.SkipReason)


def test_a_batch_just_reserved_is_left_to_its_run_on_the_way(bound, instance, monkeypatch) -> None:
    """Dagster creates the run a planner tick asked for after the tick: a reservation younger
    than the grace period may not have its run yet, and is not launched twice."""
    driver, lost = _reserved_and_lost(bound, instance)
    _later(monkeypatch, batches.RELAUNCH_AFTER_S - 1)
    assert isinstance(driver.tick(RELAUNCHER), dg.SkipReason)
    _past_the_grace_period(monkeypatch)
    (again,) = driver.tick(RELAUNCHER).run_requests
    assert again.partition_key == lost.partition_key


def test_a_batch_whose_runs_keep_failing_is_relaunched_up_to_the_cap_then_logged(
    bound, instance, monkeypatch, capsys
) -> None:
    """A run whose worker died ends failed (run monitoring fails it) and the batch is launched
    again, each time under a new run key; a batch failing every time is given up after
    ``MAX_BATCH_RUNS`` runs and said so."""
    driver, lost = _reserved_and_lost(bound, instance)

    def worker_killed(lake, recipe, plan):
        raise RuntimeError("worker killed")

    monkeypatch.setattr(batch_release, "write_batch", worker_killed)
    assert not driver.attempt(_selected(lost), partition_key=lost.partition_key).success
    _past_the_grace_period(monkeypatch)
    run_keys = []
    for _ in range(batches.MAX_BATCH_RUNS - 1):
        (again,) = driver.tick(RELAUNCHER).run_requests
        run_keys.append(again.run_key)
        assert not driver.attempt(_selected(again), partition_key=again.partition_key).success
    assert len(set(run_keys)) == len(run_keys) and lost.run_key not in run_keys
    capsys.readouterr()
    skipped = driver.tick(RELAUNCHER)
    assert isinstance(skipped, dg.SkipReason)
    assert "0 with a run to come, 1 given up" in skipped.skip_message
    logged = capsys.readouterr().err
    assert f"not relaunching {lost.partition_key}" in logged
    assert f"run {batches.MAX_BATCH_RUNS} times" in logged


def test_a_failed_batch_run_that_dagster_will_retry_is_left_to_that_retry(
    bound, instance, monkeypatch
) -> None:
    """On an instance with Dagster's ``run_retries``, a run whose worker died is retried by
    Dagster itself; the relauncher does not launch a second run beside that retry."""
    driver, lost = _reserved_and_lost(bound, instance)
    failed = _run_of(driver, lost.partition_key, dg.DagsterRunStatus.FAILURE)
    _past_the_grace_period(monkeypatch)
    instance.add_run_tags(failed.run_id, {WILL_RETRY_TAG: "true"})
    assert isinstance(driver.tick(RELAUNCHER), dg.SkipReason)
    instance.add_run_tags(failed.run_id, {WILL_RETRY_TAG: "false"})
    (again,) = driver.tick(RELAUNCHER).run_requests
    assert again.partition_key == lost.partition_key


def _two_batches_planned(bound, instance) -> tuple[Driver, list[dg.RunRequest]]:
    """Eight complete GRPO groups; the planner reserves two batches and asks for their runs."""
    driver = Driver(bound, instance)
    land_rollouts(bound.lake, groups=8, group_size=4, steps=1)
    driver.refresh()
    return driver, driver.tick("batch_grpo_planner").run_requests


def _fail_group_check_of(bad: str, monkeypatch) -> None:
    """The ``groups_complete`` check fails for batch ``bad`` (and passes as usual for others)."""
    checked_alone = batch_release.groups_complete

    def fails_for_bad(recipe, rows):
        result = checked_alone(recipe, rows)
        if rows.get_column("batch_id")[0] == bad:
            return result.model_copy(update={"passed": False})
        return result

    monkeypatch.setattr(batch_release, "groups_complete", fails_for_bad)


def test_a_batch_built_alone_is_exported_and_one_built_with_its_export_is_left_alone(
    bound, instance, monkeypatch
) -> None:
    """A partition materialized from the UI without its export is exported once its run is
    surely over; a batch the planner's run built with its export leaves nothing to do."""
    driver, (together, alone) = _two_batches_planned(bound, instance)
    driver.materialize(_selected(together), partition_key=together.partition_key)
    driver.materialize(["batch_grpo"], partition_key=alone.partition_key)
    _past_the_grace_period(monkeypatch)
    (again,) = driver.tick(RELAUNCHER).run_requests
    assert again.partition_key == alone.partition_key and _selected(again) == ["export_grpo"]
    driver.materialize(_selected(again), partition_key=alone.partition_key)
    assert isinstance(driver.tick(RELAUNCHER), dg.SkipReason)
    both = {together.partition_key, alone.partition_key}
    assert ledger.exported_batches(bound.lake, "grpo", sorted(both)) == both


def test_a_written_batch_that_fails_a_check_is_not_exported(bound, instance, monkeypatch) -> None:
    """Its rows are in the lake (the blocking check stopped its run after the write), and its
    export would refuse it: the relauncher leaves it to a person instead of failing runs."""
    driver, requests = _two_batches_planned(bound, instance)
    good, bad = [r.partition_key for r in requests]
    _fail_group_check_of(bad, monkeypatch)
    driver.materialize(["batch_grpo"], partition_key=good)
    assert not driver.attempt(["batch_grpo"], partition_key=bad).success
    assert batch_release.failed_checks(bound.lake, recipes()["grpo"], bad) == ["groups_complete"]
    _past_the_grace_period(monkeypatch)
    (again,) = driver.tick(RELAUNCHER).run_requests
    assert again.partition_key == good and _selected(again) == ["export_grpo"]
    driver.materialize(_selected(again), partition_key=good)
    assert isinstance(driver.tick(RELAUNCHER), dg.SkipReason)
    assert ledger.exported_batches(bound.lake, "grpo", [good, bad]) == {good}


def test_a_batch_given_up_is_logged_once_while_an_older_one_has_a_run_to_come(
    bound, instance, monkeypatch, capsys
) -> None:
    """The older batch in play holds the cursor back, so every tick reads the given-up one
    again; the cursor remembers it was said."""
    driver, (queued, bad) = _two_batches_planned(bound, instance)
    _run_of(driver, queued.partition_key, dg.DagsterRunStatus.QUEUED)
    _fail_group_check_of(bad.partition_key, monkeypatch)
    assert not driver.attempt(["batch_grpo"], partition_key=bad.partition_key).success
    _past_the_grace_period(monkeypatch)
    capsys.readouterr()
    for tick in range(3):
        skipped = driver.tick(RELAUNCHER)
        assert isinstance(skipped, dg.SkipReason)
        assert "1 with a run to come, 1 given up" in skipped.skip_message
        logged = capsys.readouterr().err
        assert (f"not exporting {bad.partition_key}" in logged) == (tick == 0)


def test_a_cursor_stored_as_a_bare_time_still_reads() -> None:
    """Instances keep sensor cursors across upgrades; one stored before ``given_up`` was kept."""
    cursor = batches.RelaunchCursor.parse("2026-12-06T18:00:00+00:00")
    assert cursor is not None and cursor.given_up == []
    assert batches.RelaunchCursor.parse(cursor.model_dump_json()) == cursor
    assert batches.RelaunchCursor.parse(None) is None


def test_an_export_launched_alone_refuses_a_batch_that_fails_its_checks(
    bound, instance, monkeypatch
) -> None:
    """A failed blocking check stops the export in the batch's own run, but the rows are
    written; an export launched alone (the relauncher, the UI) checks the batch itself."""
    driver, requests = _two_batches_planned(bound, instance)
    good, bad = [r.partition_key for r in requests]
    _fail_group_check_of(bad, monkeypatch)
    assert not driver.attempt(["batch_grpo", "export_grpo"], partition_key=bad).success
    refused = driver.attempt(["export_grpo"], partition_key=bad)
    assert not refused.success
    error = refused.failure_data_for_node("export_grpo").error
    assert f"batch {bad} fails groups_complete: not exported" in error.message
    assert not Path(bound.lake.uri(f"exports/grpo/{bad}")).exists()
    driver.materialize(["batch_grpo", "export_grpo"], partition_key=good)
    assert (Path(bound.lake.uri(f"exports/grpo/{good}")) / "manifest.json").exists()
