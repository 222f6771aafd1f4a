"""The ``policy_versions`` table: what the trainer announced, and the state it adds up to.

A trainer announces the policy version being served (``POST /claw/v1/policy``) and pauses model
calls around a weight sync (``POST /claw/v1/policy/pause``). Each is one ``PolicyEvent`` row in
this append-only table, which is how every proxy worker on the lake learns of it. The newest
event by (``created_at``, ``event_id``) decides: the version is the newest announce's, and calls
are paused while the newest event is a pause. Ordering by the rows themselves, not by commit,
makes the state a function of the rows alone, the same whichever way and order they were read.

The wire models of the ``/claw/v1/policy`` routes live here too, so a trainer reads them
without importing the proxy.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
from deltalake import DeltaTable
from pydantic import BaseModel, ConfigDict, Field

from claw_pipelines.identity import PolicyVersion
from claw_pipelines.lake import Lake
from claw_pipelines.lake.changes import VersionsVacuumed, changes
from claw_pipelines.lake.filters import column_bound
from claw_pipelines.schemas import PolicyEvent, utc_now

TABLE = PolicyEvent.table_name
COLUMNS = list(PolicyEvent.model_fields)
ORDER = ["created_at", "event_id"]


class PolicyState(BaseModel):
    """What the newest events say: the version served and whether model calls are held."""

    model_config = ConfigDict(frozen=True)

    version: int | None = None
    paused: bool = False
    announced_at: datetime | None = None
    paused_at: datetime | None = None


class PolicyStatus(PolicyState):
    """``GET /claw/v1/policy``: the state as the answering worker holds it, and its calls."""

    in_flight: int = Field(description="Model calls this worker let in and has not answered.")
    held: int = Field(description="Model calls this worker is holding for the pause.")
    writer_id: str = Field(description="The answering worker (one per proxy process).")


class PauseStatus(PolicyStatus):
    """``POST /claw/v1/policy/pause``: ``in_flight`` is counted after the drain wait."""

    in_flight_at_pause: int


class Announce(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: PolicyVersion


class Pause(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drain_timeout_s: float = Field(
        default=0,
        ge=0,
        le=600,
        description="Wait up to this long for this worker's in-flight calls to finish.",
    )


def newest_events(events: pl.LazyFrame) -> pl.DataFrame:
    """The newest announce and the newest event of any kind (at most two rows): all the state
    depends on, so a follower keeps these and folds the rows it reads next into them."""
    ordered = events.select(COLUMNS).sort(ORDER)
    newest = pl.concat([ordered.filter(pl.col("event") == "announce").tail(1), ordered.tail(1)])
    return newest.unique(maintain_order=True).collect()


def state_of(newest: pl.DataFrame) -> PolicyState:
    """The state ``newest_events`` rows say."""
    if newest.is_empty():
        return PolicyState()
    ordered = newest.sort(ORDER)
    last = ordered.row(-1, named=True)
    announces = ordered.filter(pl.col("event") == "announce")
    announce = announces.row(-1, named=True) if announces.height else {}
    paused = last["event"] == "pause"
    return PolicyState(
        version=announce.get("version"),
        paused=paused,
        announced_at=announce.get("created_at"),
        paused_at=last["created_at"] if paused else None,
    )


def _commit_file(version: int) -> str:
    return f"{TABLE}/_delta_log/{version:020d}.json"


class PolicyLog:
    """Follows ``policy_versions`` cheaply: a poll asks whether the Delta log's next commit file
    exists (one stat, or one HEAD on an object store) and reads only the commits made since.
    The first poll opens the table, so a proxy started late adopts its state at once; while it
    does not exist, a poll asks the same of its first commit file: an open lists the log, which
    a fleet of proxies polling four times a second would make most of an object store's load."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.state = PolicyState()
        self._table: DeltaTable | None = None
        self._newest: pl.DataFrame | None = None
        self._tried_open = False

    def poll(self) -> bool:
        """Fold in what was committed since the last poll; whether the state changed."""
        if self._table is None:
            if self._tried_open and not self.lake.files_exist([_commit_file(0)])[0]:
                return False
            self._tried_open = True
            self._table = self.lake.open(TABLE)
            rows = None if self._table is None else pl.scan_delta(self._table)
        elif self.lake.files_exist([_commit_file(self._table.version() + 1)])[0]:
            rows = self._new_rows(self._table)
        else:
            return False
        if rows is None:
            return False
        earlier = [] if self._newest is None else [self._newest.lazy()]
        self._newest = newest_events(pl.concat([*earlier, rows.select(COLUMNS)]))
        state = state_of(self._newest)
        changed, self.state = state != self.state, state
        return changed

    def next_timestamp(self) -> datetime:
        """Now, or just after the newest event read if this host's clock is behind it."""
        now = utc_now()
        if self._newest is None or self._newest.is_empty():
            return now
        return max(now, self._newest.get_column("created_at").max() + timedelta(microseconds=1))

    @staticmethod
    def _new_rows(table: DeltaTable) -> pl.LazyFrame | None:
        after = table.version()
        table.update_incremental()
        try:
            inserted = changes(table, after, table.version(), COLUMNS)
        except VersionsVacuumed:  # fell behind the vacuum retention: the snapshot has it all
            return pl.scan_delta(table)
        return None if inserted is None else inserted.lazy()


def read_state(lake: Lake) -> PolicyState:
    """The state the table says now (one read of its snapshot)."""
    log = PolicyLog(lake)
    log.poll()
    return log.state


def highest_announced_version(lake: Lake) -> int | None:
    """The highest version ever announced on the lake (None when none was)."""
    events = lake.scan(TABLE)
    if events is None:
        return None
    announced = events.filter(pl.col("event") == "announce").select(pl.col("version").max())
    return announced.collect().item()


def lag_reference(announced: int | None, steps: DeltaTable) -> int | None:
    """What ``max_policy_lag`` counts from: the highest version the trainer announced, else the
    newest ``policy_version`` among ``steps``. The highest rather than the latest so staleness
    never goes back (the planner retires stale steps for good); a trainer's versions grow."""
    if announced is not None:
        return announced
    return column_bound(steps, "policy_version", "max")
