"""The batches a recipe has reserved, in reservation order, followed through the ledger.

Each reservation is one commit to ``batch_ledger/<recipe>``. The first read takes two narrow
columns of the ledger; later ones keep the table open and read only the commits made since
(its change data feed), so a poll that finds nothing new costs one look at the Delta log.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl
from deltalake import DeltaTable

from claw_pipelines.batches.names import ledger_table
from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import changes

COLUMNS = ["batch_id", "planned_at"]


class Reservations:
    def __init__(self, lake: Lake, recipe: str) -> None:
        self.lake = lake
        self.recipe = recipe
        self._table: DeltaTable | None = None
        self._version: int | None = None
        self._planned: dict[str, datetime] = {}

    def _new_rows(self) -> pl.DataFrame | None:
        if self._table is None:
            self._table = self.lake.open(ledger_table(self.recipe))
            if self._table is None:
                return None
            self._version = self._table.version()
            return pl.scan_delta(self._table).select(COLUMNS).collect()
        self._table.update_incremental()
        latest = self._table.version()
        found = changes(self._table, self._version, latest, COLUMNS)
        self._version = latest
        return found

    def refresh(self) -> list[str]:
        """Every reserved batch id, oldest reservation first."""
        rows = self._new_rows()
        if rows is not None and rows.height:
            firsts = rows.group_by("batch_id").agg(pl.col("planned_at").min())
            for batch_id, planned_at in firsts.iter_rows():
                self._planned.setdefault(batch_id, planned_at)
        return sorted(self._planned, key=lambda b: (self._planned[b], b))

    def planned_at(self, batch_id: str) -> datetime | None:
        return self._planned.get(batch_id)
