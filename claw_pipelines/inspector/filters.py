"""The trajectory list's filters: a pydantic model at the HTTP boundary, one polars predicate,
and the page of the list a request asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

import polars as pl
from fastapi import HTTPException
from pydantic import BaseModel, Field, ValidationError

Status = Literal["", "open", "completed", "aborted", "timed_out"]
"""``timed_out``: closed by the pipeline after its idle timeout, with no completion event."""
LabelFilter = Literal["", "unlabelled", "labelled", "untrainable", "trainable"]


class TrajectoryFilter(BaseModel):
    """What a curator can narrow the list by; empty fields do not filter."""

    channel: str = ""
    agent: str = ""
    status: Status = ""
    reward_min: float | None = None
    reward_max: float | None = None
    has_reward: bool | None = None
    quality_min: float | None = Field(default=None, ge=0, le=1)
    quality_max: float | None = Field(default=None, ge=0, le=1)
    label: LabelFilter = ""
    quality_label: str = Field(
        default="", description="The trajectory's quality label or one of its steps'."
    )
    policy_version: int | None = None
    group_id: str = ""
    text: str = Field(
        default="", description="Case-insensitive substring of ids, task, answer, note, tags."
    )


class Page(BaseModel):
    page: int = Field(default=1, ge=1)
    size: int = Field(default=50, ge=1, le=500)


def _labelled() -> pl.Expr:
    """A label on the trajectory (any field set, a note or tags included) or on one of its steps."""
    return (
        pl.any_horizontal(pl.col("label", "trainable", "label_note").is_not_null())
        | (pl.col("tags").list.len() > 0)
        | (pl.col("labelled_steps") > 0)
    ).fill_null(False)


def predicate(f: TrajectoryFilter) -> pl.Expr:
    """The filter as one boolean expression over the summary frame."""
    terms: list[pl.Expr] = [pl.lit(True)]
    for column in ("channel", "agent", "status", "group_id"):
        value = getattr(f, column)
        if value:
            terms.append(pl.col(column) == value)
    if f.reward_min is not None:
        terms.append(pl.col("reward") >= f.reward_min)
    if f.reward_max is not None:
        terms.append(pl.col("reward") <= f.reward_max)
    if f.has_reward is not None:
        terms.append(pl.col("reward").is_not_null() == f.has_reward)
    if f.quality_min is not None:
        terms.append(pl.col("quality") >= f.quality_min)
    if f.quality_max is not None:
        terms.append(pl.col("quality") <= f.quality_max)
    if f.label == "unlabelled":
        terms.append(~_labelled())
    elif f.label == "labelled":
        terms.append(_labelled())
    elif f.label == "untrainable":
        terms.append((pl.col("trainable") == False) | (pl.col("untrainable_steps") > 0))  # noqa: E712
    elif f.label == "trainable":
        terms.append(pl.col("trainable").fill_null(True) & (pl.col("untrainable_steps") == 0))
    if f.quality_label:
        terms.append(
            (pl.col("label") == f.quality_label).fill_null(False)
            | pl.col("step_quality_labels").list.contains(f.quality_label)
        )
    if f.policy_version is not None:
        terms.append(pl.col("policy_versions").list.contains(f.policy_version))
    if f.text.strip():
        terms.append(pl.col("search_text").str.contains(f.text.strip().lower(), literal=True))
    return pl.all_horizontal(terms)


def apply(summary: pl.DataFrame, f: TrajectoryFilter) -> pl.DataFrame:
    """The summary rows that match, newest first (the summary is kept in that order)."""
    return summary.filter(predicate(f))


def paginate(rows: pl.DataFrame, page: Page) -> pl.DataFrame:
    return rows.slice((page.page - 1) * page.size, page.size)


def facets(summary: pl.DataFrame) -> dict[str, list]:
    """Distinct values for the filter form's drop-downs."""
    return {
        "channel": summary["channel"].drop_nulls().unique().sort().to_list(),
        "agent": summary["agent"].drop_nulls().unique().sort().to_list(),
        "quality_label": pl.concat(
            [summary["label"], summary["step_quality_labels"].explode(empty_as_null=True)]
        )
        .drop_nulls()
        .unique()
        .sort()
        .to_list(),
        "policy_version": summary["policy_versions"]
        .explode(empty_as_null=True)
        .drop_nulls()
        .unique()
        .sort()
        .to_list(),
    }


def query_filter(query: Mapping[str, str]) -> tuple[TrajectoryFilter, Page]:
    """Filter and page from the query string; empty form fields mean "not set"."""
    params = {k: v for k, v in query.items() if v.strip() != ""}
    try:
        return TrajectoryFilter.model_validate(params), Page.model_validate(params)
    except ValidationError as error:
        raise HTTPException(
            422, detail=error.errors(include_url=False, include_context=False)
        ) from error


class Listing(NamedTuple):
    """One page of the trajectory list."""

    filter: TrajectoryFilter
    page: Page
    rows: pl.DataFrame
    matched: int
    """How many trajectories the filter matches (on every page)."""


def listing(query: Mapping[str, str], summary: pl.DataFrame) -> Listing:
    """The page of ``summary`` (the inspector's trajectory rows) that ``query`` asks for."""
    f, p = query_filter(query)
    matched = apply(summary, f)
    return Listing(f, p, paginate(matched, p), matched.height)
