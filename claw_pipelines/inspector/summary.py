"""One row per trajectory, built from the light columns of the lake tables (pure polars).

The list page filters and paginates this frame in memory. It is rebuilt only for the trajectories
that new rows touched, so a refresh costs what arrived, not what the lake holds.
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.transforms.curation import labels_in_force

SNIPPET_CHARS = 160
"""Task and answer text kept per trajectory: enough for free-text search and the list."""

TURN_COLUMNS = [
    "turn_id",
    "trajectory_id",
    "group_id",
    "channel",
    "agent",
    "policy_version",
    "model",
    "status",
    "finish_reason",
    "token_source",
    "prompt_tokens",
    "completion_tokens",
    "started_at",
    "ended_at",
    "request_messages",
    "response_text",
    "_commit_version",
]
"""What the index reads from new `turns` rows; token IDs are read only when a trajectory opens."""


def _snippet(expr: pl.Expr) -> pl.Expr:
    return expr.str.replace_all(r"\s+", " ").str.slice(0, SNIPPET_CHARS)


def task_text(messages: pl.Expr) -> pl.Expr:
    """The first user message of a JSON chat (the task a rollout was given)."""
    first_role = messages.str.json_path_match("$[0].role")
    return (
        pl.when(first_role == "user")
        .then(messages.str.json_path_match("$[0].content"))
        .otherwise(messages.str.json_path_match("$[1].content"))
    )


PROVISIONAL = "turn:"
"""Prefix of the provisional trajectory id (``turn:<turn_id>``) a turn without identity is shown
under until step extraction infers its trajectory."""


def turn_index_rows(raw: pl.DataFrame) -> pl.DataFrame:
    """Light per-turn rows from newly landed `turns` rows.

    Turns without identity get a trajectory of their own (``PROVISIONAL``) until step extraction
    infers one. Only the earliest turn of each trajectory in the chunk has its messages parsed
    (task text).
    """
    return (
        raw.lazy()
        .with_columns(
            pl.coalesce("trajectory_id", pl.lit(PROVISIONAL) + pl.col("turn_id")).alias(
                "trajectory_id"
            ),
            _snippet(pl.col("response_text")).alias("response_snippet"),
        )
        .with_columns(
            (pl.col("started_at") == pl.col("started_at").min().over("trajectory_id")).alias(
                "_first"
            )
        )
        .with_columns(
            pl.when("_first").then(_snippet(task_text(pl.col("request_messages")))).alias("task"),
        )
        .drop("request_messages", "response_text", "_first", strict=False)
        .with_columns(pl.col("_commit_version").cast(pl.Int64))
        .collect()
    )


def latest(frame: pl.DataFrame, key: str, order: str = "_commit_version") -> pl.DataFrame:
    """Keep the newest row per key: derived tables may re-emit a row when an asset re-runs."""
    return frame.sort(order, nulls_last=False).unique(subset=key, keep="last", maintain_order=True)


def latest_labels(labels: pl.DataFrame, kind: str) -> pl.DataFrame:
    """The label in force per target of one kind, by the pipeline's own rule."""
    return labels_in_force(labels, kind).collect()


def trajectories_of(turns: pl.DataFrame, groups: pl.Series, turn_ids: pl.Series) -> pl.Series:
    """Trajectory ids that contain one of these turns or belong to one of these groups."""
    hit = turns.filter(
        pl.col("group_id").is_in(groups.implode()) | pl.col("turn_id").is_in(turn_ids.implode())
    )
    return hit.get_column("trajectory_id").unique()


def summarize(
    turns: pl.DataFrame,
    events: pl.DataFrame,
    rewards: pl.DataFrame,
    labels: pl.DataFrame,
    scored: pl.DataFrame,
    trajectories: pl.DataFrame,
) -> pl.DataFrame:
    """One row per trajectory in ``turns``: identity, size, status, reward, quality and label.

    ``reward`` is the outcome the batch planner sees: the completion event's reward, else the
    latest trajectory reward, else a group reward, else the sum of per-turn rewards.
    """
    placed = turns.lazy().select("turn_id", "trajectory_id")
    per_trajectory = [
        *_lifecycle(events, trajectories),
        *_trajectory_rewards(rewards, placed),
        _quality(scored, placed),
        *_labels(labels, placed),
    ]
    summary = _identity_and_size(turns).join(_group_rewards(rewards), on="group_id", how="left")
    for part in per_trajectory:
        summary = summary.join(part, on="trajectory_id", how="left")
    return (
        summary.with_columns(_status(), *_reward_columns(), *_label_counts())
        .with_columns(_search_text())
        .select(SUMMARY_COLUMNS)
        .collect()
    )


def _identity_and_size(turns: pl.DataFrame) -> pl.LazyFrame:
    return (
        turns.lazy()
        .group_by("trajectory_id")
        .agg(
            pl.col("group_id").drop_nulls().first(),
            pl.col("channel").drop_nulls().first(),
            pl.col("agent").drop_nulls().first(),
            pl.col("model").drop_nulls().first(),
            pl.len().alias("num_steps"),
            (pl.col("status") == "error").sum().alias("errors"),
            (pl.col("finish_reason") == "length").sum().alias("truncated"),
            pl.col("started_at").min(),
            pl.col("ended_at").max(),
            pl.col("policy_version").drop_nulls().unique().sort().alias("policy_versions"),
            pl.col("prompt_tokens").sum(),
            pl.col("completion_tokens").sum(),
            pl.col("task").drop_nulls().first(),
            pl.col("response_snippet").sort_by("started_at").last().alias("last_response"),
        )
        .with_columns(
            (pl.col("ended_at") - pl.col("started_at"))
            .dt.total_milliseconds()
            .truediv(1000)
            .alias("duration_s")
        )
    )


def _lifecycle(events: pl.DataFrame, trajectories: pl.DataFrame) -> list[pl.LazyFrame]:
    """The latest event of each trajectory, and what the pipeline derived of it."""
    event = (
        latest(events, "trajectory_id", order="created_at")
        .lazy()
        .select("trajectory_id", pl.col("event"), pl.col("reward").alias("event_reward"))
    )
    derived = trajectories.lazy().select(
        "trajectory_id",
        pl.col("complete").alias("derived_complete"),
        pl.col("outcome").alias("derived_outcome"),
        pl.col("outcome_reward").alias("derived_reward"),
    )
    return [event, derived]


def _trajectory_rewards(rewards: pl.DataFrame, placed: pl.LazyFrame) -> list[pl.LazyFrame]:
    """The rewards aimed at each trajectory, and those aimed at its turns."""
    by_trajectory = (
        rewards.lazy()
        .filter(pl.col("trajectory_id").is_not_null())
        .group_by("trajectory_id")
        .agg(
            pl.col("value").sort_by("created_at").last().alias("trajectory_reward"),
            pl.len().alias("trajectory_reward_count"),
            pl.col("source").unique().alias("trajectory_reward_sources"),
        )
    )
    by_turn = (
        rewards.lazy()
        .filter(pl.col("turn_id").is_not_null())
        .select("turn_id", "value", "source")
        .join(placed, on="turn_id")
        .group_by("trajectory_id")
        .agg(
            pl.col("value").sum().alias("step_reward_sum"),
            pl.len().alias("step_reward_count"),
            pl.col("source").unique().alias("step_reward_sources"),
        )
    )
    return [by_trajectory, by_turn]


def _group_rewards(rewards: pl.DataFrame) -> pl.LazyFrame:
    return (
        rewards.lazy()
        .filter(pl.col("group_id").is_not_null())
        .group_by("group_id")
        .agg(
            pl.col("value").sort_by("created_at").last().alias("group_reward"),
            pl.col("source").unique().alias("group_reward_sources"),
        )
    )


def _quality(scored: pl.DataFrame, placed: pl.LazyFrame) -> pl.LazyFrame:
    return (
        scored.lazy()
        .join(placed, on="turn_id")
        .group_by("trajectory_id")
        .agg(
            pl.col("quality_score").mean().alias("quality"),
            pl.col("quality_score").min().alias("quality_min"),
        )
    )


def _labels(labels: pl.DataFrame, placed: pl.LazyFrame) -> list[pl.LazyFrame]:
    """The latest label of each trajectory, and what the latest labels of its steps say."""
    trajectory_label = (
        latest_labels(labels, "trajectory")
        .lazy()
        .select(
            pl.col("target_id").alias("trajectory_id"),
            pl.col("quality_label").alias("label"),
            "trainable",
            "tags",
            pl.col("note").alias("label_note"),
        )
    )
    step_labels = (
        latest_labels(labels, "step")
        .lazy()
        .join(placed.rename({"turn_id": "target_id"}), on="target_id")
        .group_by("trajectory_id")
        .agg(
            pl.len().alias("labelled_steps"),
            (pl.col("trainable") == False).sum().alias("untrainable_steps"),  # noqa: E712
            pl.col("quality_label").drop_nulls().unique().sort().alias("step_quality_labels"),
        )
    )
    return [trajectory_label, step_labels]


def _status() -> pl.Expr:
    return (
        pl.when(pl.col("event") == "aborted")
        .then(pl.lit("aborted"))
        .when((pl.col("event") == "completed") | pl.col("derived_complete").fill_null(False))
        .then(pl.lit("completed"))
        .when(pl.col("derived_outcome") == "timeout")
        .then(pl.lit("timed_out"))
        .otherwise(pl.lit("open"))
        .alias("status")
    )


NO_STRINGS = pl.lit([], dtype=pl.List(pl.String))


def _reward_columns() -> list[pl.Expr]:
    """``reward`` (see ``summarize``), how many rewards there are and from which sources."""
    return [
        pl.coalesce(
            "event_reward", "trajectory_reward", "group_reward", "step_reward_sum", "derived_reward"
        ).alias("reward"),
        (
            pl.col("trajectory_reward_count").fill_null(0)
            + pl.col("step_reward_count").fill_null(0)
            + pl.col("group_reward").is_not_null().cast(pl.UInt32)
            + pl.col("event_reward").is_not_null().cast(pl.UInt32)
        ).alias("reward_count"),
        pl.concat_list(
            pl.col("trajectory_reward_sources").fill_null(NO_STRINGS),
            pl.col("step_reward_sources").fill_null(NO_STRINGS),
            pl.col("group_reward_sources").fill_null(NO_STRINGS),
            pl.when(pl.col("event_reward").is_not_null())
            .then(pl.lit(["env"]))
            .otherwise(NO_STRINGS),
        )
        .list.unique()
        .list.sort()
        .alias("reward_sources"),
    ]


def _label_counts() -> list[pl.Expr]:
    return [
        pl.col("labelled_steps").fill_null(0),
        pl.col("untrainable_steps").fill_null(0),
        pl.col("step_quality_labels").fill_null(NO_STRINGS),
    ]


def _search_text() -> pl.Expr:
    """What the list's search box matches: ids, identity, the last response and labels."""
    return (
        pl.concat_str(
            [
                "trajectory_id",
                "group_id",
                "channel",
                "agent",
                "model",
                "task",
                "last_response",
                "label",
                "label_note",
                pl.col("tags").list.join(" "),
                pl.col("step_quality_labels").list.join(" "),
            ],
            separator="\n",
            ignore_nulls=True,
        )
        .str.to_lowercase()
        .alias("search_text")
    )


SUMMARY_COLUMNS = [
    "trajectory_id",
    "group_id",
    "channel",
    "agent",
    "model",
    "status",
    "num_steps",
    "errors",
    "truncated",
    "started_at",
    "ended_at",
    "duration_s",
    "policy_versions",
    "prompt_tokens",
    "completion_tokens",
    "reward",
    "reward_count",
    "reward_sources",
    "quality",
    "quality_min",
    "label",
    "trainable",
    "tags",
    "label_note",
    "labelled_steps",
    "untrainable_steps",
    "step_quality_labels",
    "task",
    "last_response",
    "search_text",
]


def upsert(summary: pl.DataFrame, fresh: pl.DataFrame, affected: pl.Series) -> pl.DataFrame:
    """Replace the rows of the ``affected`` trajectories by ``fresh``; newest-started first.

    A trajectory may disappear from ``fresh`` (a turn first seen alone was later inferred into
    another trajectory), so removal goes by ``affected``, not by ``fresh``.
    """
    kept = summary.filter(~pl.col("trajectory_id").is_in(affected.implode()))
    return pl.concat([kept, fresh], how="vertical_relaxed").sort("started_at", descending=True)
