"""``resources/run_worker_storage.py``: a forked run stores its events in the instance's SQLite
files through kept connections, and what it stores is what the rest of the instance reads."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME
from dagster._serdes import ConfigurableClassData

from resources.run_worker_storage import (
    KeptConnectionsEventLogStorage,
    RunWorkerSqliteStorage,
    run_worker_ref,
)


@dg.asset(check_specs=[dg.AssetCheckSpec("positive", asset="numbers")])
def numbers() -> dg.MaterializeResult:
    return dg.MaterializeResult(
        metadata={"rows": 3}, check_results=[dg.AssetCheckResult(passed=True)]
    )


def test_only_dagsters_default_sqlite_storage_is_swapped(tmp_path: Path) -> None:
    ref = InstanceRef.from_dir(str(tmp_path))
    swapped = run_worker_ref(ref)
    assert swapped.storage_data.class_name == RunWorkerSqliteStorage.__name__
    assert swapped.storage_data.config_yaml == ref.storage_data.config_yaml
    assert swapped._replace(storage_data=ref.storage_data) == ref
    other = ref._replace(
        storage_data=ConfigurableClassData("dagster_postgres", "DagsterPostgresStorage", "{}")
    )
    assert run_worker_ref(other) == other


def test_a_runs_events_land_where_the_instance_reads_them(tmp_path: Path) -> None:
    stock = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path)))
    worker = dg.DagsterInstance.from_ref(run_worker_ref(stock.get_ref()))
    storage = worker.event_log_storage
    assert isinstance(storage, KeptConnectionsEventLogStorage)

    runs = [dg.materialize([numbers], instance=worker).run_id for _ in range(2)]

    for run_id in runs:
        stored = [e.dagster_event_type for e in stock.all_logs(run_id) if e.is_dagster_event]
        assert dg.DagsterEventType.ASSET_MATERIALIZATION in stored
        assert dg.DagsterEventType.ASSET_CHECK_EVALUATION in stored
        assert stock.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS
        # the run's own file took each event (the webserver follows a run by watching it),
        # its write-ahead log checkpointed as each connection closed
        assert not Path(storage.path_for_shard(run_id) + "-wal").exists()
    latest = stock.get_latest_materialization_event(dg.AssetKey("numbers"))
    assert latest.run_id == runs[-1]
    assert latest.asset_materialization.metadata["rows"] == dg.IntMetadataValue(3)
    check = stock.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("numbers"), "positive")]
    )
    assert check[dg.AssetCheckKey(dg.AssetKey("numbers"), "positive")].run_id == runs[-1]
    # one connection to index.db served every statement of both runs
    index = storage._engines[INDEX_SHARD_NAME].pool
    assert index.checkedin() == 1 and index.checkedout() == 0
    worker.dispose()
    assert not storage._engines
