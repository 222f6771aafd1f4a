"""Curation decisions as `labels` rows: one step, one trajectory, or every trajectory of a filter.

Labels are appended (history is kept, the latest wins); the pipeline's `curated_steps` asset applies
them on its next refresh, so the inspector never rewrites a derived table itself. A note is free
text and is scrubbed of secrets like every stored string; the label, tags and author are stored
verbatim (they are filtered on), so one shaped like a secret is refused instead.
"""

from __future__ import annotations

from typing import Annotated, Literal

import polars as pl
import pyarrow as pa
from pydantic import BaseModel, Field, field_validator, model_validator

from claw_pipelines.inspector.filters import TrajectoryFilter, apply
from claw_pipelines.inspector.summary import PROVISIONAL
from claw_pipelines.inspector.tables import LakeState
from claw_pipelines.lake import Lake
from claw_pipelines.redaction import NotSecret, Redactor
from claw_pipelines.schemas import Label, new_id, utc_now


class LabelRequest(BaseModel):
    """A curator's decision and what it applies to.

    A label sets the fields it carries and keeps the earlier ones (``tags: []`` clears the tags).
    """

    target_kind: Literal["step", "trajectory", "filter"]
    target_ids: list[str] = Field(default_factory=list, max_length=10_000)
    filter: TrajectoryFilter | None = None
    quality_label: Annotated[str, Field(max_length=100), NotSecret] | None = None
    trainable: bool | None = None
    tags: list[Annotated[str, NotSecret]] | None = Field(default=None, max_length=50)
    note: str | None = Field(default=None, max_length=4000)
    author: Annotated[str, Field(min_length=1, max_length=100), NotSecret]

    @model_validator(mode="after")
    def _says_something(self) -> LabelRequest:
        if (
            self.quality_label is None
            and self.trainable is None
            and self.tags is None
            and not self.note
        ):
            raise ValueError("a label sets at least one of quality_label, trainable, tags, note")
        if self.target_kind == "filter" and self.filter is None:
            raise ValueError("target_kind 'filter' needs a filter")
        if self.target_kind != "filter" and not self.target_ids:
            raise ValueError("target_ids is empty")
        return self

    @field_validator("quality_label")
    @classmethod
    def _quality_label_not_blank(cls, value: str | None) -> str | None:
        """A blank label would set nothing useful and add an empty choice to the list's filter."""
        if value is not None and not value.strip():
            raise ValueError("must not be blank (leave it out to keep the current label)")
        return value


class LabelResult(BaseModel):
    written: int
    target_kind: Literal["step", "trajectory"]
    labels_version: int | None


class UnknownTargets(ValueError):
    """Some ids name no step or trajectory the inspector has seen."""


def resolve_targets(request: LabelRequest, state: LakeState) -> tuple[str, pl.Series]:
    """The label rows' target kind and ids; a filter labels each trajectory it matches."""
    if request.target_kind == "filter":
        assert request.filter is not None
        return "trajectory", apply(state.summary, request.filter)["trajectory_id"]
    ids = pl.Series("target_id", request.target_ids, dtype=pl.String).unique(maintain_order=True)
    known = state["turns"]["turn_id" if request.target_kind == "step" else "trajectory_id"]
    missing = ids.filter(~ids.is_in(known.implode()))
    if missing.len():
        raise UnknownTargets(f"unknown {request.target_kind} ids: {missing.head(5).to_list()}")
    return request.target_kind, ids


def label_rows(request: LabelRequest, kind: str, ids: pl.Series) -> pa.Table:
    """One `labels` row per target, all stamped with the same author and time."""
    prefix = new_id()
    frame = pl.DataFrame({"target_id": ids}).select(
        pl.format("{}-{}", pl.lit(prefix), pl.int_range(pl.len())).alias("label_id"),
        pl.lit(kind).alias("target_kind"),
        "target_id",
        pl.lit(request.quality_label, dtype=pl.String).alias("quality_label"),
        pl.lit(request.trainable, dtype=pl.Boolean).alias("trainable"),
        pl.lit(request.tags, dtype=pl.List(pl.String)).alias("tags"),
        pl.lit(request.note, dtype=pl.String).alias("note"),
        pl.lit(request.author).alias("author"),
        pl.lit(utc_now()).dt.cast_time_unit("us").alias("created_at"),
    )
    return frame.to_arrow().cast(Label.arrow_schema())


def write_labels(
    lake: Lake, request: LabelRequest, state: LakeState, redactor: Redactor
) -> LabelResult:
    if request.note:
        request = request.model_copy(update={"note": redactor.text(request.note)})
    kind, ids = resolve_targets(request, state)
    if ids.is_empty():
        return LabelResult(written=0, target_kind=kind, labels_version=state.versions.get("labels"))
    version = lake.append(Label.table_name, _label_table(request, kind, ids))
    return LabelResult(written=ids.len(), target_kind=kind, labels_version=version)


def _label_table(request: LabelRequest, kind: str, ids: pl.Series) -> pa.Table:
    """The label rows; a trajectory still shown under its provisional id (a turn without
    identity, ``turn:<id>``) is labelled through its only step. The pipeline names that
    trajectory only once it infers it, so a label on the provisional id would match nothing,
    while a step label follows the turn into whatever trajectory it joins."""
    if kind == "step":
        return label_rows(request, kind, ids)
    provisional = ids.str.starts_with(PROVISIONAL)
    turn_ids = ids.filter(provisional).str.strip_prefix(PROVISIONAL)
    return pa.concat_tables(
        [label_rows(request, kind, ids.filter(~provisional)), label_rows(request, "step", turn_ids)]
    )
