"""What a reserved batch was planned from, kept with its ledger rows and in its manifest:
re-planning from these pins gives the same batch (``batching.ledger``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class Pins(BaseModel):
    """The input table versions, read start, announced policy version, planning time,
    position and recipe of one batch. Fields missing from batches reserved before they existed
    take the value that re-plans those batches as they were planned."""

    model_config = ConfigDict(frozen=True)

    curated_steps: int
    steps: int | None = None
    turns: int | None = -1
    batch_ledger: int
    """-1: the ledger did not exist yet."""
    batch_retired: int = -1
    """-1: no retirements were usable."""
    open_since: datetime | None = None
    """The earliest start of a step of a trajectory still in play: the plan read the curated
    steps started since (None: every curated step). Pins recorded before it held
    ``open_from``, a trajectory id, now ignored: re-planned from every curated step, such a
    batch comes out the same, as what a plan skips is consumed or retired at the pinned
    versions."""
    announced_policy_version: int | None = None
    planned_at: datetime
    position: int = 0
    """The batch's place among the batches one plan reserved together (0: the first, or the
    only one): a re-plan takes the batch at that position of the plan."""
    recipe: dict[str, Any] | None = None
    """The recipe as it was, without its exports (None: reserved before recipes were pinned)."""
