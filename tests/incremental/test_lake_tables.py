"""How derived tables are read and written: keyed reads, bounds from file statistics,
statistics kept for flat columns only, compactions that lost a race, wait for small files or
merge tier by tier."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from claw_pipelines.derived_schemas import EXTRACTED_STEPS, TOKEN_COLUMNS, WRITER
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.lake import Lake, commits
from claw_pipelines.lake.changes import changes
from claw_pipelines.lake.commits import commit, compact
from claw_pipelines.lake.filters import column_bound, keyed
from claw_pipelines.lake.properties import TABLE_CONFIGURATION


def test_keyed_reads_exactly_the_keys_across_files(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    for ids in (["t-1", "t-2", "t-3"], ["t-4", "t-5"]):
        lake.append("ids", pa.table({"id": ids}))
    ids = lake.scan("ids")
    picked = keyed(ids, "id", pl.Series(["t-5", None, "t-2", "t-9", "t-5"])).collect()
    assert sorted(picked.get_column("id")) == ["t-2", "t-5"]
    assert keyed(ids, "id", pl.Series([None], dtype=pl.String)).collect().is_empty()


def test_column_bound_comes_from_file_statistics_and_falls_back_to_a_scan(tmp_path: Path) -> None:
    """The newest policy version and the oldest closed tail are read from the files'
    statistics: they hold with the data files gone. A table written without statistics is
    scanned instead."""
    versions = [pa.table({"v": pa.array(v, pa.int64())}) for v in ([1, 3], [None, None], [7, 2])]
    with_stats, without = str(tmp_path / "with"), str(tmp_path / "without")
    for table in versions:
        write_deltalake(with_stats, table, mode="append")
        write_deltalake(
            without,
            table,
            mode="append",
            configuration={"delta.dataSkippingNumIndexedCols": "0"},
        )
    for data_file in Path(with_stats).glob("*.parquet"):
        data_file.unlink()
    for bound, expected in (("max", 7), ("min", 1)):
        assert column_bound(DeltaTable(with_stats), "v", bound) == expected
        assert column_bound(DeltaTable(without), "v", bound) == expected


def test_derived_tables_keep_statistics_for_flat_columns_only(tmp_path: Path) -> None:
    """Files and row groups are skipped by ids, times and versions, so those keep their
    statistics; the token lists, which no reader filters on, are written without. Every column
    is zstd-compressed (writer properties that name no codec write uncompressed Parquet)."""
    steps = Path(tmp_path / "steps")
    names = ["step_id", "turn_id", "trajectory_id", "policy_version", *TOKEN_COLUMNS]
    rows = pa.table(
        [["s-1"], ["u-1"], ["t-1"], [3], [[1, 2]], [[3]], [[-0.1]]],
        schema=pa.schema([EXTRACTED_STEPS.field(name) for name in names]),
    )
    write_deltalake(str(steps), rows, writer_properties=WRITER)
    (data_file,) = steps.glob("*.parquet")
    chunks = pq.ParquetFile(data_file).metadata.row_group(0)
    with_min_max = {
        chunk.path_in_schema.split(".")[0]
        for chunk in (chunks.column(i) for i in range(chunks.num_columns))
        if chunk.statistics is not None and chunk.statistics.has_min_max
    }
    assert {"step_id", "turn_id", "trajectory_id", "policy_version"} <= with_min_max
    assert not with_min_max & set(TOKEN_COLUMNS)
    assert {chunks.column(i).compression for i in range(chunks.num_columns)} == {"ZSTD"}
    assert column_bound(DeltaTable(str(steps)), "policy_version", "max") == 3


def test_a_compaction_another_writer_got_ahead_of_is_skipped(tmp_path: Path) -> None:
    """Compaction runs after a run's own commit: when another writer removed files it would
    merge, it is skipped (the run's commit stands) and the other writer's rows are intact."""
    uri = str(tmp_path / "t")
    for batch in ("a", "b", "c"):
        write_deltalake(uri, pa.table({"batch_id": [batch]}), mode="append")
    stale = DeltaTable(uri)
    DeltaTable(uri).delete("batch_id = 'b'")
    compact(stale, max_files=1)
    assert stale.version() == 2
    assert sorted(pl.scan_delta(uri).collect()["batch_id"]) == ["a", "c"]
    compact(DeltaTable(uri), max_files=1)
    assert len(DeltaTable(uri).file_uris()) == 1


def test_compaction_leaves_full_files_as_they_are_and_waits_for_enough_small_ones(
    tmp_path: Path,
) -> None:
    """A file past the target is never merged again, so a ledger's merged files keep spanning
    the stretch they were written in; and only the files under it count towards compacting,
    so a table of many full files is not compacted after every commit."""
    uri, target = str(tmp_path / "t"), 64 << 10
    full = pa.table({"v": pa.array(range(0, 10**12, 10**7), pa.int64())})  # 100k values
    for _ in range(2):
        write_deltalake(uri, full, mode="append")
    kept = set(DeltaTable(uri).file_uris())
    table = DeltaTable(uri)
    for n in range(3):
        commit(table, pa.table({"v": [n]}), compact_after=2, target_size=target)
        merged = "OPTIMIZE" in {entry["operation"] for entry in table.history()}
        assert merged == (n == 2)  # after the third small file, not after 4 or 5 files
    assert kept < set(table.file_uris()) and len(table.file_uris()) == 3
    assert pl.scan_delta(uri).select(pl.len()).collect().item() == 200_003


def test_a_change_feed_read_holds_the_rows_columns_and_on_request_their_version(
    tmp_path: Path,
) -> None:
    """Every reader of what is new gets the table's own columns, not the feed's bookkeeping;
    ``with_version`` adds the version each row landed in."""
    lake = Lake(str(tmp_path / "lake"))
    first = lake.append("ids", pa.table({"id": ["a"], "n": [1]}))
    last = lake.append("ids", pa.table({"id": ["b"], "n": [2]}))
    table = lake.open("ids")
    newer = changes(table, first, last)
    assert newer.columns == ["id", "n"] and newer["id"].to_list() == ["b"]
    every = changes(table, None, last, ["id"], with_version=True)
    assert every.columns == ["id", "_commit_version"]
    assert dict(every.iter_rows()) == {"a": first, "b": last}
    assert changes(table, last, last) is None


def test_a_derived_table_made_before_lists_removed_files_for_an_hour_after_its_next_run(
    tmp_path: Path,
) -> None:
    """A derived table created with Delta's 7-day tombstone retention takes the hour on its
    next run's commit (its checkpoints then stop listing older removed files), keeps its rows,
    and later runs commit nothing more for it."""
    lake = Lake(str(tmp_path / "lake"))
    lake.append("source", pa.table({"trajectory_id": ["t-1", "t-2"]}))
    retention = "delta.deletedFileRetentionDuration"
    old = {k: v for k, v in TABLE_CONFIGURATION.items() if k != retention}
    lake.ensure("summary", pa.schema([("trajectory_id", pa.string())]), old)
    versions = []
    for run in range(2):
        increment = Increment.begin(lake, "summary", "summary", ["source"])
        written = increment.commit(increment.new_rows("source", ["trajectory_id"]).to_arrow())
        assert written.metadata().configuration[retention] == "interval 1 hours"
        versions.append(written.version())
        lake.append("source", pa.table({"trajectory_id": [f"t-{run + 3}"]}))
    assert versions[1] == versions[0] + 1  # the second run's own commit only
    assert sorted(lake.scan("summary").collect()["trajectory_id"]) == ["t-1", "t-2", "t-3"]


def test_compaction_rewrites_each_row_about_once_per_merge_size_however_old_the_table(
    tmp_path: Path, monkeypatch
) -> None:
    """Merged to one size (64 KB here), each compaction rewrote the file the previous one made
    with the new small files, until it was full: 5.2 times the table's bytes over these 150
    commits, more as the size grows. Merged tier by tier (4, 16 and 64 KB), each row is
    rewritten about once per size, and the files stay few."""
    monkeypatch.setattr(commits, "SMALLEST_MERGE_BYTES", 4 << 10)
    monkeypatch.setattr(commits, "MERGE_FANOUT", 4)
    target, max_files = 64 << 10, 4
    assert commits.merge_sizes(target) == [4 << 10, 16 << 10, 64 << 10]
    uri, values = str(tmp_path / "t"), np.random.default_rng(0)
    write_deltalake(uri, pa.table({"v": values.integers(0, 1 << 40, 200)}))
    table = DeltaTable(uri)
    for _ in range(150):
        commit(table, pa.table({"v": values.integers(0, 1 << 40, 200)}))
        compact(table, max_files=max_files, target_size=target)
    rewritten = sum(
        json.loads(entry["operationMetrics"]["filesRemoved"])["totalSize"]
        for entry in table.history()
        if entry["operation"] == "OPTIMIZE"
    )
    file_bytes = pl.DataFrame(table.get_add_actions()).get_column("size_bytes")
    assert rewritten <= 3.5 * file_bytes.sum()
    assert len(file_bytes) <= max_files * 3 + file_bytes.sum() // (32 << 10)
    assert pl.scan_delta(uri).select(pl.len()).collect().item() == 151 * 200
