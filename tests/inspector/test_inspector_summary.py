"""Pure polars functions of the inspector: summary, filters, prefix check, label rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from lake_rows import rollout_turns

from claw_pipelines.inspector import render
from claw_pipelines.inspector.api_models import Tokens
from claw_pipelines.inspector.batch_preview import dropped_table, group_table
from claw_pipelines.inspector.curation import LabelRequest, label_rows
from claw_pipelines.inspector.filters import TrajectoryFilter, apply, facets
from claw_pipelines.inspector.summary import summarize, turn_index_rows, upsert
from claw_pipelines.inspector.tables import FEEDS, adopt_placements, conform
from claw_pipelines.inspector.trajectory import prefix_check
from claw_pipelines.schemas import Label, Turn

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LABEL = {
    "label_id": "l",
    "target_kind": "trajectory",
    "trainable": False,
    "author": "x",
    "created_at": T0,
}


def _turns(*rollouts: tuple[str, str, int, str]) -> pl.DataFrame:
    """(trajectory, group, policy_version, channel) -> the index's light turn rows."""
    rows = [
        turn.model_dump()
        for i, (trajectory, group, version, channel) in enumerate(rollouts)
        for turn in rollout_turns(
            trajectory,
            group,
            2,
            3,
            5,
            start=T0 + timedelta(seconds=10 * i),
            policy_version=version,
            channel=channel,
            agent="a",
            seed=i,
        )
    ]
    raw = pl.DataFrame(rows, schema=pl.DataFrame(Turn.arrow_schema().empty_table()).schema)
    return turn_index_rows(raw.with_columns(pl.lit(3, pl.Int64).alias("_commit_version")))


def _frame(table: str, rows: list[dict]) -> pl.DataFrame:
    feed = FEEDS[table]
    return conform(pl.DataFrame(rows), feed.schema) if rows else feed.empty()


def _summary(turns, events=(), rewards=(), labels=(), scored=(), trajectories=()) -> pl.DataFrame:
    return summarize(
        turns,
        _frame("trajectory_events", list(events)),
        _frame("rewards", list(rewards)),
        _frame("labels", list(labels)),
        _frame("scored_steps", list(scored)),
        _frame("trajectories", list(trajectories)),
    )


def test_turn_rows_keep_task_of_first_turn_and_give_identityless_turns_their_own_trajectory():
    turns = _turns(("t1", "g1", 1, "train"))
    assert turns["task"].drop_nulls().to_list() == ["What is 2 + 3? Answer with 'The answer is N'."]
    lone = turns.head(1).with_columns(pl.lit(None, pl.String).alias("trajectory_id"))
    raw = lone.rename({"response_snippet": "response_text"}).with_columns(
        pl.lit("[]").alias("request_messages")
    )
    assert turn_index_rows(raw)["trajectory_id"][0] == "turn:" + lone["turn_id"][0]


def test_summary_status_reward_quality_and_labels():
    turns = _turns(("t1", "g1", 1, "train"), ("t2", "g1", 2, "eval"), ("t3", "g2", 2, "train"))
    t1_turns = turns.filter(pl.col("trajectory_id") == "t1")["turn_id"].to_list()
    summary = _summary(
        turns,
        events=[
            {"trajectory_id": "t1", "event": "completed", "reward": 1.0, "created_at": T0},
            {"trajectory_id": "t2", "event": "aborted", "reward": None, "created_at": T0},
        ],
        rewards=[
            {"reward_id": "r1", "group_id": "g1", "value": 0.5, "source": "rule", "created_at": T0},
            {
                "reward_id": "r2",
                "turn_id": t1_turns[0],
                "value": 0.2,
                "source": "model",
                "created_at": T0,
            },
        ],
        labels=[
            {
                "label_id": "l1",
                "target_kind": "trajectory",
                "target_id": "t1",
                "trainable": True,
                "quality_label": "good",
                "author": "x",
                "created_at": T0,
            },
            {
                "label_id": "l2",
                "target_kind": "trajectory",
                "target_id": "t1",
                "trainable": False,
                "quality_label": "bad",
                "author": "y",
                "created_at": T0 + timedelta(seconds=1),
            },
            {
                "label_id": "l3",
                "target_kind": "step",
                "target_id": t1_turns[1],
                "trainable": False,
                "author": "y",
                "created_at": T0,
            },
        ],
        scored=[
            {"turn_id": t, "quality_score": q} for t, q in zip(t1_turns, [0.4, 0.8], strict=True)
        ],
        trajectories=[{"trajectory_id": "t3", "complete": True, "outcome_reward": 0.25}],
    ).sort("trajectory_id")
    assert summary["status"].to_list() == ["completed", "aborted", "completed"]
    assert summary["reward"].to_list() == [1.0, 0.5, 0.25]
    t1 = summary.row(0, named=True)
    assert t1["num_steps"] == 2
    assert t1["quality"] == pytest.approx(0.6)
    assert (t1["label"], t1["trainable"], t1["untrainable_steps"]) == ("bad", False, 1)
    assert t1["reward_sources"] == ["env", "model", "rule"]
    assert summary["policy_versions"].to_list() == [[1], [2], [2]]


def test_filters_combine_and_free_text_is_case_insensitive():
    turns = _turns(("t1", "g1", 1, "train"), ("t2", "g1", 2, "eval"), ("t3", "g2", 2, "train"))
    t1_step = turns.filter(pl.col("trajectory_id") == "t1")["turn_id"][0]
    summary = _summary(
        turns,
        events=[
            {"trajectory_id": t, "event": "completed", "reward": r, "created_at": T0}
            for t, r in [("t1", 1.0), ("t2", 0.0)]
        ],
        labels=[
            LABEL | {"target_id": "t2", "quality_label": "Bad", "tags": ["loop"]},
            LABEL | {"label_id": "n", "target_id": "t3", "trainable": None, "note": "seen"},
            LABEL | {"label_id": "s", "target_kind": "step", "target_id": t1_step,
                     "trainable": None, "quality_label": "StepBad"},
        ],
    )  # fmt: skip
    timed_out = _summary(
        turns, trajectories=[{"trajectory_id": "t3", "complete": False, "outcome": "timeout"}]
    )
    assert dict(timed_out.select("trajectory_id", "status").iter_rows()) == {
        "t1": "open",
        "t2": "open",
        "t3": "timed_out",
    }

    def ids(**kwargs) -> list[str]:
        return sorted(apply(summary, TrajectoryFilter(**kwargs))["trajectory_id"].to_list())

    assert ids() == ["t1", "t2", "t3"]
    assert ids(channel="train") == ["t1", "t3"]
    assert ids(status="open") == ["t3"]
    assert ids(reward_min=0.5) == ["t1"]
    assert ids(has_reward=False) == ["t3"]
    assert ids(policy_version=2) == ["t2", "t3"]
    assert ids(label="untrainable") == ["t2"]
    assert ids(label="unlabelled") == []
    assert ids(label="labelled") == ["t1", "t2", "t3"]
    assert ids(quality_label="StepBad") == ids(text="stepbad") == ["t1"]
    assert ids(text="LOOP") == ["t2"]
    assert ids(text="the answer is 5", channel="eval") == ["t2"]
    assert ids(group_id="g2") == ["t3"]
    assert facets(summary)["policy_version"] == [1, 2]
    assert facets(summary)["quality_label"] == ["Bad", "StepBad"]


def test_upsert_replaces_affected_rows_only():
    turns = _turns(("t1", "g1", 1, "train"), ("t2", "g1", 1, "train"))
    before = _summary(turns)
    completed = {"trajectory_id": "t1", "event": "completed", "reward": 1.0, "created_at": T0}
    after = _summary(turns.filter(pl.col("trajectory_id") == "t1"), events=[completed])
    merged = upsert(before, after, pl.Series(["t1"]))
    assert merged.height == 2
    statuses = dict(merged.select("trajectory_id", "status").iter_rows())
    assert statuses == {"t1": "completed", "t2": "open"}


def test_adopt_inferred_moves_identityless_turns():
    turns = _turns(("t1", "g1", 1, "train")).with_columns(
        pl.concat_str(pl.lit("turn:"), "turn_id").alias("trajectory_id")
    )
    steps = pl.DataFrame(
        {
            "turn_id": turns["turn_id"],
            "trajectory_id": ["inferred"] * 2,
            "trajectory_inferred": [True] * 2,
        }
    )
    moved, changed = adopt_placements(turns, steps)
    assert moved["trajectory_id"].unique().to_list() == ["inferred"]
    assert set(changed.to_list()) == {"inferred", *turns["trajectory_id"].to_list()}


def test_prefix_check_finds_consistent_steps_and_names_breaks():
    steps = pl.DataFrame(
        {
            "trajectory_id": ["t"] * 4,
            "step_index": [0, 1, 2, 3],
            "prompt_token_ids": [[1, 2], [1, 2, 3, 4, 9], [1, 2, 3, 4, 9, 5, 7], [8, 1]],
            "response_token_ids": [[3, 4], [5, 6], [1], [2]],
        }
    )
    out = prefix_check(steps.lazy()).collect()
    assert out["prefix_consistent_computed"].to_list() == [None, True, False, False]
    assert out["shared_prefix_computed"].to_list() == [0, 4, 5, 0]
    reasons = out["prefix_break_reason_computed"].to_list()
    assert reasons[:2] == [None, None]
    assert reasons[2].startswith("previous response not reproduced")
    assert reasons[3].startswith("context edit")


def test_label_rows_match_the_labels_schema():
    request = LabelRequest(
        target_kind="trajectory", target_ids=["a", "b"], trainable=False, tags=["x"], author="me"
    )
    table = label_rows(request, "trajectory", pl.Series(["a", "b"]))
    assert table.schema == Label.arrow_schema()
    rows = table.to_pylist()
    assert [r["target_id"] for r in rows] == ["a", "b"]
    assert {r["trainable"] for r in rows} == {False}
    assert rows[0]["label_id"] != rows[1]["label_id"]
    with pytest.raises(ValueError, match="at least one"):
        LabelRequest(target_kind="step", target_ids=["a"], author="me")


def test_batch_preview_tables_for_grouped_and_pair_plans():
    grpo = pl.DataFrame(
        {
            "group_id": ["g", "g", "g"],
            "trajectory_id": ["a", "a", "b"],
            "reward": [1.0, 1.0, 0.0],
            "outcome_reward": [1.0, 1.0, 0.0],
        }
    )
    row = group_table(grpo, grpo).row(0, named=True)
    assert (row["rollouts"], row["steps"], row["reward_min"], row["reward_max"]) == (2, 3, 0.0, 1.0)
    assert row["reward_std"] == pytest.approx(0.5)
    dpo = pl.DataFrame(
        {
            "group_id": ["g"],
            "trajectory_id": ["a"],
            "turn_id": ["a0"],
            "rejected_turn_id": ["b0"],
            "chosen_reward": [1.0],
            "rejected_reward": [0.0],
        }
    )
    consumed = pl.DataFrame({"turn_id": ["a0", "b0"], "trajectory_id": ["a", "b"]})
    pair = group_table(dpo, consumed).row(0, named=True)
    assert (pair["rollouts"], pair["steps"], pair["reward_min"], pair["reward_max"]) == (
        2,
        2,
        0.0,
        1.0,
    )
    assert pair["trajectory_id"] == ["a", "b"]
    dropped = pl.DataFrame(
        {
            "turn_id": ["1", "2", "3"],
            "trajectory_id": ["a", "a", "b"],
            "group_id": ["g", "g", "g"],
            "reason": ["untrainable", "untrainable", "zero_variance"],
        }
    )
    reasons = dropped_table(dropped).rows(named=True)
    assert [(r["reason"], r["steps"], r["trajectories"]) for r in reasons] == [
        ("untrainable", 2, 1),
        ("zero_variance", 1, 1),
    ]


def test_inspector_shows_the_label_batches_honour_on_a_timestamp_tie() -> None:
    from datetime import UTC, datetime

    from claw_pipelines.inspector.summary import latest_labels
    from claw_pipelines.schemas import Label, rows_to_arrow
    from claw_pipelines.transforms.curation import latest_labels as pipeline_labels

    at = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        Label(label_id=i, target_kind="trajectory", target_id="t", trainable=v, created_at=at)
        for i, v in (("b", False), ("a", True))
    ]
    labels = pl.from_arrow(rows_to_arrow(Label, [r.model_dump() for r in rows]))
    shown = latest_labels(labels, "trajectory").row(0, named=True)["trainable"]
    applied = pipeline_labels(labels, "trajectory", "trajectory_id").collect()
    assert shown is applied.row(0, named=True)["_trajectory_trainable"] is False


def test_token_spans_escape_each_text_and_colour_by_probability():
    spans = render.token_spans(
        Tokens(ids=[7, 8], texts=["<b>&", '"x"'], logprobs=[0.0, None], probs=[1.0, None])
    )
    assert spans == (
        '<span class="tok" style="background: hsl(120, 75%, 82%)" title="id 7 · logprob 0.000">'
        "&lt;b&gt;&amp;</span>"
        '<span class="tok" style="background: transparent" title="id 8 · logprob n/a">'
        "&#34;x&#34;</span>"
    )
