"""Landing-table maintenance in-process: compaction and vacuum never lose a row a reader has
yet to read."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster_harness import Driver
from dagster_rollouts import land_rollouts

from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import VersionsVacuumed, changes
from claw_pipelines.lake.commits import compact
from claw_pipelines.lease import Lease

VACUUM_NOW = {
    "ops": {
        "maintain_landing_tables": {
            "config": {"vacuum_retention_hours": 0, "enforce_retention_duration": False}
        }
    }
}


def _files_on_disk(lake: Lake, table: str) -> int:
    return len(list(Path(lake.uri(table)).glob("*.parquet")))


def test_compacting_landing_tables_reads_no_turn_twice(driver: Driver, bound, monkeypatch) -> None:
    """The scheduled job merges the landing tables' small files; the ingest sensor does not
    report the merge as new data, and the steps asset's change-feed read skips it, so no turn is
    read twice and then only turns landed after it. The default retention keeps the merged
    files (they are younger than 7 days)."""
    import assets.maintenance

    monkeypatch.setattr(assets.maintenance, "COMPACT_AFTER_FILES", 2)
    for seed in range(3):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    driver.refresh()
    job = bound.defs.resolve_job_def("landing_maintenance")
    assert job.execute_in_process(instance=driver.instance).success
    for table in ("turns", "trajectory_events"):
        assert len(bound.lake.open(table).file_uris()) == 1, table
        assert _files_on_disk(bound.lake, table) == 4, table

    assert isinstance(driver.tick("landing_ingest_sensor"), dg.SkipReason)  # no new data
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 0
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=3)
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 2
    steps = bound.lake.scan("steps").collect()
    assert steps.height == steps.get_column("step_id").n_unique() == 8


def test_vacuuming_landing_tables_deletes_the_merged_files_and_keeps_every_row(
    driver: Driver, bound, monkeypatch
) -> None:
    """Past the retention (0 here, enforcement off) the job deletes the files it merged; the
    rows are unchanged, the vacuum commits are not new data, and the chain reads on."""
    import assets.maintenance

    monkeypatch.setattr(assets.maintenance, "COMPACT_AFTER_FILES", 2)
    for seed in range(3):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    driver.refresh()
    landed = {table: bound.lake.scan(table).collect() for table in ("turns", "trajectory_events")}
    job = bound.defs.resolve_job_def("landing_maintenance")
    assert job.execute_in_process(instance=driver.instance, run_config=VACUUM_NOW).success
    for table, rows in landed.items():
        assert _files_on_disk(bound.lake, table) == 1, table
        kept = bound.lake.scan(table).collect()
        assert kept.sort(kept.columns).equals(rows.sort(rows.columns)), table
    assert isinstance(driver.tick("landing_ingest_sensor"), dg.SkipReason)
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=3)
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 2


def test_the_retention_is_enforced_unless_turned_off(driver: Driver, bound) -> None:
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    too_short = {"ops": {"maintain_landing_tables": {"config": {"vacuum_retention_hours": 0}}}}
    job = bound.defs.resolve_job_def("landing_maintenance")
    result = job.execute_in_process(
        instance=driver.instance, run_config=too_short, raise_on_error=False
    )
    assert not result.success
    refused = result.failure_data_for_node("maintain_landing_tables").error.cause
    assert "minimum retention for vacuum" in refused.message


def test_the_vacuum_keeps_what_a_lagging_reader_has_yet_to_read(
    driver: Driver, bound, monkeypatch
) -> None:
    """The steps asset read turns up to a version; the versions after it are merged, and the job
    vacuums with retention 0: it keeps their files, so steps reads on and misses no turn."""
    import assets.maintenance

    monkeypatch.setattr(assets.maintenance, "COMPACT_AFTER_FILES", 2)
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    driver.refresh()
    for seed in (1, 2):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    job = bound.defs.resolve_job_def("landing_maintenance")
    assert job.execute_in_process(instance=driver.instance, run_config=VACUUM_NOW).success
    assert len(bound.lake.open("turns").file_uris()) == 1
    assert driver.refresh()["steps"]["rows_read"]["turns"] == 4
    assert bound.lake.scan("steps").collect().height == 6
    assert job.execute_in_process(instance=driver.instance, run_config=VACUUM_NOW).success
    assert _files_on_disk(bound.lake, "turns") == 1  # everyone read on: the merged files go


def test_a_reader_whose_versions_were_vacuumed_elsewhere_fails_clearly(
    driver: Driver, bound
) -> None:
    """A vacuum outside the job deletes the files of versions the steps asset has yet to read:
    its change-feed read says so instead of failing on a missing file. A read from the start
    takes the snapshot, every row at the latest version."""
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    driver.refresh()
    for seed in (1, 2):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    compact(bound.lake.open("turns"), max_files=1)
    bound.lake.vacuum("turns", 0, enforce_retention_duration=False)
    turns, read = bound.lake.open("turns"), bound.lake.open("steps").transaction_version(
        "claw/steps/turns")  # fmt: skip
    with pytest.raises(VersionsVacuumed, match="fell further behind than the vacuum retention"):
        changes(turns, read, turns.version())
    result = driver.attempt(["steps"])
    assert not result.success
    assert result.failure_data_for_node("steps").error.cause.cls_name == "VersionsVacuumed"
    rows = changes(turns, None, turns.version(), ["turn_id"], with_version=True)
    assert rows.height == 6 and set(rows["_commit_version"]) == {turns.version()}


def test_the_job_waits_while_a_proxy_holds_the_lease(driver: Driver, bound, monkeypatch) -> None:
    """The job and the proxies' maintainers take one lease in the lake: while a proxy holds
    it the job does nothing; once it is free, the job's pass runs and lets it go."""
    import assets.maintenance

    monkeypatch.setattr(assets.maintenance, "COMPACT_AFTER_FILES", 2)
    for seed in range(3):
        land_rollouts(bound.lake, groups=1, group_size=2, steps=1, seed=seed)
    proxy = Lease(bound.lake, "proxy-worker", 600)
    assert proxy.acquire()
    job = bound.defs.resolve_job_def("landing_maintenance")
    assert job.execute_in_process(instance=driver.instance).success
    assert len(bound.lake.open("turns").file_uris()) == 3  # untouched
    proxy.release()
    assert job.execute_in_process(instance=driver.instance).success
    assert len(bound.lake.open("turns").file_uris()) == 1
    assert proxy.acquire()  # released by the job
