"""``BatchConsumer``: a trainer's cursor over a recipe's exported batches, kept in the lake.

A trainer asks ``next()`` for the oldest exported batch it has not acked, trains on it and
``ack()``s it; the ack is a Delta commit (``batch_consumption/<recipe>``), so a trainer that
restarts under the same consumer name resumes where it was, and each consumer name sees every
batch. A batch taken but never acked comes back after a restart (at least once).

Waiting polls at a bounded rate (``poll_interval_s``), each poll reading only known objects:
the ledger's Delta log (new reservations, then only the commits since) and the manifests of
the reserved batches not exported yet, oldest first. A local lake answers that in
milliseconds; on an object store it is a couple of requests per poll, never a listing of the
exports, however many there are.
"""

from __future__ import annotations

import time

import polars as pl

from claw_pipelines.batches.names import manifest_path
from claw_pipelines.lake import Lake
from claw_pipelines.trainer.acks import acked_batches, acks_of, record_ack
from claw_pipelines.trainer.batch import Batch
from claw_pipelines.trainer.reservations import Reservations

POLL_INTERVAL_S = 0.5
"""How often a waiting ``next()`` looks: a batch is seen within this of its manifest landing."""

MANIFESTS_PER_LOOK = 64
"""Manifests a poll checks at each end of the reservations not known exported: the oldest (a
consumer working through history) and the newest (where a new export lands). So a poll costs at
most twice this many existence checks, however many batches the lake holds."""


class BatchConsumer:
    """The exported batches of ``recipe`` that ``consumer`` has not trained on yet.

    It reads and writes only the lake, so a trainer needs no service to take batches; telling
    the proxies which policy version is served, around a weight sync, is ``PolicyClient``'s
    (the proxy's address and key).
    """

    def __init__(
        self,
        recipe: str,
        consumer: str = "default",
        lake_uri: str | None = None,
        *,
        storage_options: dict[str, str] | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.recipe = recipe
        self.consumer = consumer
        self.lake = (
            Lake.from_settings() if lake_uri is None else Lake(lake_uri, storage_options or {})
        )
        self.poll_interval_s = poll_interval_s
        self._reservations = Reservations(self.lake, recipe)
        self._acked = acked_batches(self.lake, recipe, consumer)
        self._taken: set[str] = set()
        self._exported: set[str] = set()

    def _unseen(self) -> list[str]:
        """Reserved batches neither acked nor taken by this consumer, oldest first."""
        done = self._acked | self._taken
        return [b for b in self._reservations.refresh() if b not in done]

    def _look(self, candidates: list[str]) -> str | None:
        """The oldest of ``candidates`` whose export finished (its manifest exists)."""
        unexported = [b for b in candidates if b not in self._exported]
        probe = list(
            dict.fromkeys(unexported[:MANIFESTS_PER_LOOK] + unexported[-MANIFESTS_PER_LOOK:])
        )
        found = self.lake.files_exist([manifest_path(self.recipe, b) for b in probe])
        self._exported.update(b for b, exists in zip(probe, found, strict=True) if exists)
        return next((b for b in candidates if b in self._exported), None)

    def next(self, timeout_s: float | None = None) -> Batch | None:
        """Block until an exported batch this consumer has not acked (nor taken since it
        started) exists and return it, oldest first; None once ``timeout_s`` passed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            batch_id = self._look(self._unseen())
            if batch_id is not None:
                batch = Batch.load(self.lake, self.recipe, batch_id)
                self._taken.add(batch_id)
                return batch
            wait = self.poll_interval_s
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return None
            time.sleep(wait)

    def ack(self, batch_id: str, trainer_step: int | None = None) -> None:
        """Record durably that this consumer trained on ``batch_id``."""
        if batch_id in self._acked:
            return
        if batch_id not in self._reservations.refresh():
            raise KeyError(f"{batch_id} is not a reserved batch of {self.recipe}")
        record_ack(self.lake, self.recipe, self.consumer, batch_id, trainer_step)
        self._acked.add(batch_id)
        self._taken.discard(batch_id)

    def batches(self) -> pl.DataFrame:
        """Every reserved batch, oldest first: batch_id, planned_at, exported, and whether and
        at which trainer step this consumer acked it (one existence check per batch not known
        exported: a listing, not a poll)."""
        reserved = self._reservations.refresh()
        unexported = [b for b in reserved if b not in self._exported]
        found = self.lake.files_exist([manifest_path(self.recipe, b) for b in unexported])
        self._exported.update(b for b, exists in zip(unexported, found, strict=True) if exists)
        mine = acks_of(self.lake, self.recipe).filter(pl.col("consumer") == self.consumer)
        listed = pl.DataFrame(
            {
                "batch_id": reserved,
                "planned_at": [self._reservations.planned_at(b) for b in reserved],
                "exported": [b in self._exported for b in reserved],
            },
            schema={"batch_id": pl.String, "planned_at": pl.Datetime("us", "UTC"),
                    "exported": pl.Boolean},
        )  # fmt: skip
        acked = mine.select("batch_id", "trainer_step", "acked_at")
        return listed.join(acked, on="batch_id", how="left", maintain_order="left").with_columns(
            acked=pl.col("acked_at").is_not_null()
        )
