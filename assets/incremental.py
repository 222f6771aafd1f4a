"""Watermarks and idempotent commits for the incremental assets.

An asset's watermark is kept in its own output table, not in Dagster: every commit carries one
Delta app transaction per input, ``claw/<asset>/<input>`` = the input's Delta version read up to.
Rows and watermark land in the same atomic commit, so:

* a re-run reads only versions after the watermark and can never re-append what it committed;
* a run that crashed after committing (before Dagster recorded it) is not replayed;
* two runs of the same asset racing from the same snapshot collide on the app id and delta-rs
  rejects the second commit (``Concurrent transaction failed``) instead of duplicating rows.

Carried-over state (e.g. the steps of trajectories still open) lives in a side table that is
overwritten *before* the output commit with the same transactions; after a crash between the
two commits the state table is one run ahead, and ``state_as_of`` time-travels back to the
state that matches the output's watermark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from claw_pipelines.lake import Lake

STATE_LOOKBACK = 5
"""How many state-table versions to walk back to find the one matching a watermark."""


def app_id(asset: str, source: str) -> str:
    return f"claw/{asset}/{source}"


def _watermark(table: DeltaTable | None, asset: str, sources: list[str]) -> dict[str, int | None]:
    if table is None:
        return dict.fromkeys(sources)
    return {s: table.transaction_version(app_id(asset, s)) for s in sources}


@dataclass
class Increment:
    """One run's view of its inputs: per input the Delta version range ``(after, upto]``."""

    lake: Lake
    asset: str
    output: str
    snapshot: DeltaTable | None
    after: dict[str, int | None]
    upto: dict[str, int | None]
    rows_read: dict[str, int] = field(default_factory=dict)

    @classmethod
    def begin(cls, lake: Lake, asset: str, output: str, sources: list[str]) -> Increment:
        """Pin the watermark (from the output table) and each input's current version."""
        snapshot = lake.open(output)
        return cls(
            lake=lake,
            asset=asset,
            output=output,
            snapshot=snapshot,
            after=_watermark(snapshot, asset, sources),
            upto={s: lake.version(s) for s in sources},
        )

    @property
    def has_new_data(self) -> bool:
        return any(
            upto is not None and (self.after[s] is None or upto > self.after[s])
            for s, upto in self.upto.items()
        )

    def new_rows(
        self, source: str, columns: list[str] | None = None, *, keep_version: bool = False
    ) -> pl.DataFrame | None:
        """Rows inserted into ``source`` within this run's range (None when none).

        ``keep_version`` keeps ``_commit_version`` (the input version each row landed in).
        """
        if self.upto[source] is None:
            return None
        frame, _ = self.lake.read_changes(
            source, self.after[source], up_to_version=self.upto[source], columns=columns
        )
        if frame is None:
            return None
        cdf = ["_change_type", "_commit_timestamp"] + ([] if keep_version else ["_commit_version"])
        self.rows_read[source] = frame.height
        return frame.drop(cdf, strict=False)

    def scan(self, source: str) -> pl.LazyFrame | None:
        """The whole input as of the version this run pinned."""
        if self.upto[source] is None:
            return None
        return self.lake.scan(source, self.upto[source])

    def rows_where(self, source: str, column: str, keys: list[str]) -> pl.DataFrame | None:
        """Every row of ``source`` (as of the pinned version) whose ``column`` is in ``keys``."""
        frame = self.scan(source)
        if frame is None:
            return None
        return frame.filter(pl.col(column).is_in(keys)).collect()

    def _transactions(self) -> list[Transaction]:
        return [
            Transaction(app_id=app_id(self.asset, s), version=v)
            for s, v in self.upto.items()
            if v is not None
        ]

    def _properties(self) -> CommitProperties:
        return CommitProperties(
            max_commit_retries=self.lake.max_commit_retries,
            app_transactions=self._transactions(),
            custom_metadata={"claw.asset": self.asset, "claw.read": json.dumps(self.ranges())},
        )

    def commit(self, data: pa.Table, replace: tuple[str, list[str]] | None = None) -> DeltaTable:
        """Write this run's rows and advance the watermark in one commit (even with 0 rows).

        ``replace=(column, keys)`` first removes the rows whose ``column`` is in ``keys`` (same
        commit): recomputed trajectories replace their old rows instead of duplicating them.
        A run that read nothing new writes nothing (no empty versions from periodic sweeps).
        """
        if self.snapshot is not None and not self.has_new_data and data.num_rows == 0:
            return self.snapshot
        if self.snapshot is None or replace is None or not replace[1]:
            target = self.snapshot or self.lake.ensure(self.output, data.schema)
            write_deltalake(target, data, mode="append", commit_properties=self._properties())
        else:
            column, keys = replace
            quoted = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
            write_deltalake(
                self.snapshot,
                data,
                mode="overwrite",
                predicate=f"{column} IN ({quoted})",
                commit_properties=self._properties(),
            )
        return self.lake.open(self.output)

    def replace_state(self, state_table: str, data: pa.Table) -> None:
        """Overwrite the carried-over state, tagged with this run's watermark."""
        target = self.lake.ensure(state_table, data.schema)
        write_deltalake(
            target,
            data,
            mode="overwrite",
            schema_mode="overwrite",
            commit_properties=self._properties(),
        )

    def state_as_of(self, state_table: str) -> pl.DataFrame | None:
        """The state written by the run that produced the output's current watermark."""
        if all(v is None for v in self.after.values()):
            return None
        latest = self.lake.open(state_table)
        if latest is None:
            raise RuntimeError(f"{state_table} is missing but {self.output} has a watermark")
        sources = list(self.after)
        version = latest.version()
        for candidate in range(version, max(version - STATE_LOOKBACK, -1), -1):
            table = latest if candidate == version else self.lake.open(state_table, candidate)
            if _watermark(table, self.asset, sources) == self.after:
                return self.lake.scan(state_table, candidate).collect()
        raise RuntimeError(f"no version of {state_table} matches watermark {self.after}")

    def ranges(self) -> dict[str, list[int | None]]:
        """Per input ``[after, upto]``: the Delta version range this run read."""
        return {s: [self.after[s], self.upto[s]] for s in self.upto}


def trajectory_ids(*frames: pl.DataFrame | None) -> list[str]:
    """The distinct trajectories present in any of ``frames``: the keys a run recomputes."""
    ids = [f.get_column("trajectory_id") for f in frames if f is not None and f.height]
    if not ids:
        return []
    return pl.concat(ids).drop_nulls().unique().sort().to_list()
