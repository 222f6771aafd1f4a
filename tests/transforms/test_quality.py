"""Quality signals and human labels."""

from __future__ import annotations

import json

import polars as pl
import pytest
from transform_rows import SYSTEM, at, chain, event, events, labels, turn, turns

from claw_pipelines.derived_schemas import CURATED_STEPS, conform
from claw_pipelines.transforms import (
    QualityConfig,
    curate_steps,
    extract_steps,
    reward_steps,
    score_steps,
)
from claw_pipelines.transforms.quality import repeated_ngram_ratio
from claw_pipelines.transforms.reward_rules import RewardConfig
from claw_pipelines.transforms.steps import stored_steps


def _scored(*rows, latest=None, config=None, **kwargs) -> dict[str, dict]:
    """Scores of the extracted steps, checked equal to those of the rows the step table stores
    (signals, no token lists or replies), which need no ``turns``."""
    steps = extract_steps(turns(*rows), None, None, now=at(5000)).steps
    config = config or QualityConfig()
    scored = score_steps(
        reward_steps(steps, None, None, RewardConfig()), steps, config,
        latest_policy_version=latest, **kwargs,
    ).collect()  # fmt: skip
    stored = stored_steps(steps, config.repetition_ngram)
    from_table = score_steps(
        reward_steps(stored, None, None, RewardConfig()), None, config,
        latest_policy_version=latest, **kwargs,
    ).collect()  # fmt: skip
    assert from_table.equals(scored)
    return {r["step_id"]: r for r in scored.iter_rows(named=True)}


def _one(turn_id: str, response=(5, 6, 7), **fields):
    fields = {"policy_version": 5, **fields}
    return turn(turn_id, [*SYSTEM, 1], list(response), trajectory_id=turn_id, **fields)


BAD_TOOL = json.dumps(
    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}
)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"token_source": "retokenized"}, "not_engine_tokens"),
        ({"response_logprobs": None}, "logprobs_missing"),
        ({"response_logprobs": [-0.1]}, "logprobs_misaligned"),
        ({"finish_reason": "length"}, "truncated"),
        ({"response": (), "response_text": "", "response_logprobs": []}, "empty_response"),
        ({"response": (1, 2, 3, 4) * 4, "response_logprobs": [-0.1] * 16}, "repetitive"),
        ({"response_message": BAD_TOOL}, "malformed_tool_call"),
        ({"status": "error"}, "error"),
        ({"policy_version": 1}, "stale"),
    ],
)
def test_each_signal_lowers_the_score(fields, reason):
    fields = dict(fields)
    response = fields.pop("response", (5, 6, 7))
    got = _scored(_one("x", response, **fields), latest=9)["x"]
    weight = getattr(QualityConfig().weights, reason)
    assert reason in got["quality_reasons"]
    assert got["quality_score"] == pytest.approx(max(0.0, 1 - weight))


def test_steps_of_an_aborted_trajectory_are_marked_aborted():
    """An aborted rollout (crash, env error) is not trained like a completed one by default."""
    closed = events(event("a", "aborted"), event("c", "completed"))
    steps = extract_steps(turns(_one("a"), _one("c")), None, closed, now=at(10)).steps
    scored = score_steps(reward_steps(steps, None, None, RewardConfig()), steps, QualityConfig())
    got = {r["trajectory_id"]: r for r in scored.collect().iter_rows(named=True)}
    assert got["a"]["quality_reasons"] == ["aborted"]
    assert got["a"]["quality_score"] == pytest.approx(1 - QualityConfig().weights.aborted)
    assert got["c"]["quality_reasons"] == [] and got["c"]["quality_score"] == 1.0


def test_a_negative_weight_is_refused():
    with pytest.raises(ValueError, match="aborted"):
        QualityConfig.model_validate({"weights": {"aborted": -0.5}})


def test_repeated_ngram_ratio_counts_repeats_per_sequence():
    sequences = pl.Series(
        "response_token_ids",
        [[1, 2, 3, 1, 2, 3], None, [], [1, 2], [5, 5, 5, 5, 5], [1, 2, 3, 4]],
        pl.List(pl.Int32),
    )
    assert repeated_ngram_ratio(sequences, 2).to_list() == [0.4, 0.0, 0.0, 0.0, 0.75, 0.0]
    assert repeated_ngram_ratio(sequences, 1).to_list() == [0.5, 0.0, 0.0, 0.0, 0.8, 0.0]
    assert repeated_ngram_ratio(sequences.head(0), 4).to_list() == []


def test_clean_steps_score_one_and_breaks_and_outliers_are_flagged():
    rows = [_one(f"n{i}", policy_version=5) for i in range(24)]
    rows.append(_one("long", range(200), response_logprobs=[-0.1] * 200, policy_version=5))
    rows += [
        turn("p0", [*SYSTEM, 1, 2], [3], trajectory_id="P", policy_version=5),
        turn("p1", [*SYSTEM, 9], [4], trajectory_id="P", start=5, policy_version=5),
    ]
    got = _scored(*rows)
    assert got["n0"]["quality_score"] == 1.0 and got["n0"]["quality_reasons"] == []
    assert got["long"]["quality_reasons"] == ["length_outlier"]
    assert got["p1"]["quality_reasons"] == ["prefix_break"]
    few = _scored(*rows[:3], rows[24])
    assert few["long"]["quality_reasons"] == []


def test_weights_add_up_and_clip_at_zero():
    fields = {"status": "error", "finish_reason": "length", "token_source": "none"}
    assert _scored(_one("x", **fields))["x"]["quality_score"] == 0.0
    off = QualityConfig.model_validate({"weights": {"error": 0, "not_engine_tokens": 0}})
    assert _scored(_one("x", **fields), config=off)["x"]["quality_score"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="unknown"):
        QualityConfig.model_validate({"weights": {"unknown": 1}})


def test_labels_latest_wins_and_step_overrides_trajectory():
    rows = [*chain("A", 2), *chain("B", 1, base=100)]
    steps = extract_steps(turns(*rows), None, events(event("A"), event("B")), now=at(50)).steps
    scored = score_steps(reward_steps(steps, None, None, RewardConfig()), steps, QualityConfig())
    landed = labels(
        {"target_kind": "trajectory", "target_id": "A", "trainable": True, "quality_label": "ok",
         "created_at": at(10)},
        {"target_kind": "trajectory", "target_id": "A", "trainable": False, "quality_label": "bad",
         "tags": ["loop"], "created_at": at(20)},
        {"target_kind": "step", "target_id": "A-1", "quality_label": "good", "note": "fine",
         "created_at": at(5)},
    )  # fmt: skip
    curated = curate_steps(scored, landed).collect()
    conform(curated, CURATED_STEPS)
    got = {r["step_id"]: r for r in curated.iter_rows(named=True)}
    assert (got["A-0"]["quality_label"], got["A-0"]["trainable"], got["A-0"]["tags"]) == (
        "bad",
        False,
        ["loop"],
    )
    assert (got["A-1"]["quality_label"], got["A-1"]["trainable"], got["A-1"]["label_note"]) == (
        "good",
        False,
        "fine",
    )
    assert (got["B-0"]["trainable"], got["B-0"]["tags"], got["B-0"]["quality_label"]) == (
        True,
        [],
        None,
    )
    assert curate_steps(scored, None).collect()["trainable"].all()


def test_a_later_note_or_tag_keeps_the_fields_earlier_labels_set():
    steps = extract_steps(turns(*chain("A", 2)), None, events(event("A")), now=at(50)).steps
    scored = score_steps(reward_steps(steps, None, None, RewardConfig()), steps, QualityConfig())
    landed = labels(
        {"target_kind": "trajectory", "target_id": "A", "trainable": False, "tags": ["loop"],
         "created_at": at(10)},
        {"target_kind": "trajectory", "target_id": "A", "note": "reviewed", "created_at": at(20)},
        {"target_kind": "trajectory", "target_id": "A", "tags": [], "created_at": at(30)},
    )  # fmt: skip
    curated = curate_steps(scored, landed).collect()
    assert curated.select("trainable", "tags", "label_note").unique().rows() == [
        (False, [], "reviewed")
    ]
