"""Apply human labels to scored steps."""

from __future__ import annotations

import polars as pl

from claw_pipelines.derived_schemas import CURATED_STEPS, fit

_FIELDS = {"quality_label": "quality_label", "trainable": "trainable", "tags": "tags",
           "note": "label_note"}  # fmt: skip


def labels_in_force(labels: pl.LazyFrame | pl.DataFrame, kind: str) -> pl.LazyFrame:
    """The labels in force per target of ``kind``: each field from the latest label that set it.

    A label sets the fields it carries and leaves the others as they were, so a later note or
    tag never undoes an earlier ``trainable = false``; ``author`` and ``created_at`` are the
    latest label's. Latest is by created_at, ties by label_id. The one rule for "latest wins":
    batches (via ``curate_steps``) and the inspector both use it, so the label a curator sees is
    the label a batch honours.
    """
    return (
        labels.lazy()
        .filter(pl.col("target_kind") == kind)
        .sort("created_at", "label_id")
        .group_by("target_id", maintain_order=True)
        .agg(
            *(pl.col(field).drop_nulls().last() for field in _FIELDS),
            pl.col("author", "created_at", "label_id").last(),
        )
    )


def latest_labels(labels: pl.LazyFrame | pl.DataFrame, kind: str, key: str) -> pl.LazyFrame:
    """The label fields in force per target of ``kind``, keyed as ``key``, prefixed by kind."""
    return labels_in_force(labels, kind).select(
        pl.col("target_id").alias(key),
        *(pl.col(field).alias(f"_{kind}_{field}") for field in _FIELDS),
    )


def curate_steps(
    scored: pl.LazyFrame | pl.DataFrame, labels: pl.LazyFrame | pl.DataFrame | None
) -> pl.LazyFrame:
    """``CURATED_STEPS`` rows: quality_label, trainable (default true), tags, label_note.

    Per target and field the latest label that set it wins (``labels_in_force``); a step label
    overrides its trajectory's label field by field (fields no step label set fall back).
    """
    frame = scored.lazy()
    if labels is None:
        curated = frame.with_columns(
            pl.lit(None, pl.String).alias("quality_label"),
            pl.lit(True).alias("trainable"),
            pl.lit([], pl.List(pl.String)).alias("tags"),
            pl.lit(None, pl.String).alias("label_note"),
        )
    else:
        curated = (
            frame.join(latest_labels(labels, "step", "turn_id"), on="turn_id", how="left")
            .join(latest_labels(labels, "trajectory", "trajectory_id"), on="trajectory_id",
                  how="left")
            .with_columns(
                pl.coalesce(f"_step_{field}", f"_trajectory_{field}").alias(column)
                for field, column in _FIELDS.items()
            )
            .with_columns(
                pl.col("trainable").fill_null(True),
                pl.col("tags").fill_null(pl.lit([], pl.List(pl.String))),
            )
        )  # fmt: skip
    return fit(curated, CURATED_STEPS)  # a column the scored rows predate is null


def labelled_trajectories(labels: pl.DataFrame | None, scored: pl.LazyFrame | None) -> pl.DataFrame:
    """Trajectories that ``labels`` touch: a trajectory label its target, a step label the
    trajectory of its turn_id in ``scored`` (None: nothing scored yet, so nothing to re-curate)."""
    if labels is None or scored is None:
        return pl.DataFrame(schema={"trajectory_id": pl.String})
    by_trajectory = labels.filter(pl.col("target_kind") == "trajectory").select(
        pl.col("target_id").alias("trajectory_id")
    )
    step_targets = labels.filter(pl.col("target_kind") == "step").get_column("target_id")
    by_step = (
        scored.filter(pl.col("turn_id").is_in(step_targets.to_list()))
        .select("trajectory_id")
        .collect()
    )
    return pl.concat([by_trajectory, by_step])
