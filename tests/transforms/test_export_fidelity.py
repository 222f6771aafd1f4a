"""What trainers read is what the policy did: tool-call arguments a chat template can iterate,
truncated replies never closed, fixed verl widths, per-trajectory group statistics."""

from __future__ import annotations

import json

import datasets
import jinja2
import numpy as np
import polars as pl
import pytest
from test_exporters import _curated, _plan
from transform_rows import SYSTEM, at, turn

from claw_pipelines.batches.manifest import VerlLayout
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching.planner import plan_batch
from claw_pipelines.exporters import Destination, export_batch
from claw_pipelines.exporters.verl import verl_arrays

QWEN3_STYLE = """{%- for message in messages -%}
<|im_start|>{{ message.role }}
{% if message.content %}{{ message.content }}{% endif %}
{%- for tool_call in message.tool_calls or [] %}
<tool_call>
<function={{ tool_call.function.name }}>
{%- for name, value in tool_call.function.arguments.items() %}
<parameter={{ name }}>{{ value }}</parameter>
{%- endfor %}
</function>
</tool_call>
{%- endfor %}<|im_end|>
{% endfor -%}"""
"""The shape of Qwen3-Coder / Qwen3.5 templates: arguments must be a mapping."""

ARGUMENTS = json.dumps({"expression": "6*7"})
CALL = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": ARGUMENTS}}
TOOL_REPLY = json.dumps({"role": "assistant", "content": None, "tool_calls": [CALL]})


def _rendered(path) -> str:
    """The first row's messages through the template, as TRL loads the file (``datasets``)."""
    rows = datasets.Dataset.from_parquet(str(path))
    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(QWEN3_STYLE)
    return template.render(messages=rows[0]["messages"])


def test_a_tool_call_renders_through_a_template_that_iterates_its_arguments(tmp_path):
    history = [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    rows = [
        turn("s0", [*SYSTEM, 1], [5, 6], trajectory_id="s", response_message=TOOL_REPLY,
             request_messages=json.dumps(history[:1])),
        turn("s1", [*SYSTEM, 1, 5, 6, 9], [7], trajectory_id="s", start=2,
             request_messages=json.dumps(history)),
    ]  # fmt: skip
    sft = Recipe(name="sft", algorithm="sft", group_size=1, groups_per_batch=1, exports=["trl"])
    export_batch(sft, _plan(sft, rows, {"s": 1.0}).rows, Destination(str(tmp_path)))
    text = _rendered(tmp_path / "trl/sft_messages.parquet")
    assert "<function=calculator>\n<parameter=expression>6*7</parameter>" in text
    assert text.endswith("a-s1<|im_end|>\n")


def test_a_truncated_reply_is_never_closed_and_pairs_leave_it_out(tmp_path):
    prompt = [*SYSTEM, 2]
    pair = [
        turn("good", prompt, [1], trajectory_id="t1", group_id="g", finish_reason="length"),
        turn("bad", prompt, [2], trajectory_id="t2", group_id="g", start=1),
    ]
    dpo = Recipe(name="dpo", algorithm="dpo", groups_per_batch=1, min_reward_gap=0.5)
    plan = _plan(dpo, pair, {"t1": 1.0, "t2": 0.0})
    assert not plan.ready
    assert "truncated" in plan.dropped.filter(pl.col("turn_id") == "good")["reason"].to_list()

    keep = dpo.model_copy(update={"keep_truncated": True})
    plan = _plan(keep, pair, {"t1": 1.0, "t2": 0.0})
    assert plan.ready and plan.rows["chosen_finish_reason"].to_list() == ["length"]
    export_batch(keep, plan.rows, Destination(str(tmp_path / "dpo")))
    assert pl.read_parquet(tmp_path / "dpo/trl/preference.parquet").height == 0
    tokens = pl.read_parquet(tmp_path / "dpo/trl/preference_tokens.parquet")
    assert tokens.select("chosen_ids", "chosen_finish_reason").row(0) == ([1], "length")

    cut = [turn("c0", [*SYSTEM, 1], [5, 6], trajectory_id="c", finish_reason="length"),
           turn("e0", [*SYSTEM, 3], [8], trajectory_id="e", start=1)]  # fmt: skip
    sft = Recipe(name="sft", algorithm="sft", group_size=1, groups_per_batch=2,
                 exports=["trl", "jsonl"])  # fmt: skip
    export_batch(sft, _plan(sft, cut, {"c": 1.0, "e": 1.0}).rows, Destination(str(tmp_path / "s")))
    lines = (tmp_path / "s/jsonl/trajectories.jsonl").read_text().splitlines()
    reasons = {json.loads(line)["trajectory_id"]:
               json.loads(line)["sequences"][0]["finish_reason"] for line in lines}  # fmt: skip
    assert reasons == {"c": "length", "e": "stop"}
    chats = pl.read_parquet(tmp_path / "s/trl/sft_messages.parquet")
    assert chats["trajectory_id"].to_list() == ["e"]
    steps = pl.read_parquet(tmp_path / "s/trl/sft_tokens.parquet").sort("trajectory_id")
    assert steps["finish_reason"].to_list() == ["length", "stop"]
    assert steps["input_ids"][0].to_list() == [*SYSTEM, 1, 5, 6]  # the engine's IDs, no end


def _two_step_group():
    """Group g: trajectory a (two steps, score 1), b and c (one step, score 0)."""
    return [
        turn("a0", [*SYSTEM, 1], [7, 8], trajectory_id="a", group_id="g"),
        turn("a1", [*SYSTEM, 1, 7, 8, 3], [4], trajectory_id="a", group_id="g", start=2),
        turn("b0", [*SYSTEM, 1], [5], trajectory_id="b", group_id="g", start=1),
        turn("c0", [*SYSTEM, 1], [6], trajectory_id="c", group_id="g", start=1.5),
    ]


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_group_statistics_per_trajectory_count_each_trajectory_once(algorithm):
    recipe = Recipe(name=algorithm, algorithm=algorithm, group_size=3, groups_per_batch=1,
                    filters={"min_quality": 0}, credit_assignment={"method": "broadcast"},
                    group_statistics="per_trajectory")  # fmt: skip
    rows = _plan(recipe, _two_step_group(), {"a": 1.0, "b": 0.0, "c": 0.0}).rows
    scores = np.array([1.0, 0.0, 0.0])  # one per trajectory, not per step
    if algorithm == "grpo":
        expected = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
    else:
        expected = (scores - scores.mean()) * 3 / 2
    by_trajectory = dict(zip("abc", expected, strict=True))
    for row in rows.iter_rows(named=True):
        assert row["advantage"] == pytest.approx(by_trajectory[row["trajectory_id"]])
    tensors, non_tensors = verl_arrays(rows)
    assert np.allclose(tensors["advantages"], rows["advantage"].to_numpy()[:, None]
                       * tensors["response_mask"])  # fmt: skip
    assert non_tensors["batch_keys"].tolist() == ["g_0_0", "g_0_1", "g_1_0", "g_2_0"]
    assert non_tensors["__num_turns__"].tolist() == [4, 4, 2, 2]
    per_step = recipe.model_copy(update={"group_statistics": "per_step"})
    plain = _plan(per_step, _two_step_group(), {"a": 1.0, "b": 0.0, "c": 0.0}).rows
    assert plain["advantage"].is_null().all() and "advantages" not in verl_arrays(plain)[0]


def test_fixed_widths_truncate_or_refuse_and_padding_rows_carry_no_loss():
    rows = _plan(Recipe(name="grpo", group_size=3, groups_per_batch=1, filters={"min_quality": 0}),
                 _two_step_group(), {"a": 1.0, "b": 0.0, "c": 0.0}).rows  # fmt: skip
    with pytest.raises(ValueError, match="turn a1: 24 prompt and 1 response tokens"):
        verl_arrays(rows, VerlLayout(prompt_length=23))
    left = VerlLayout(prompt_length=23, response_length=1, truncation="left", pad_to_multiple=8)
    tensors, non_tensors = verl_arrays(rows, left)
    assert tensors["prompts"].shape == (8, 23) and tensors["responses"].shape == (8, 1)
    assert tensors["prompts"][1].tolist() == [*SYSTEM[1:], 1, 7, 8, 3]  # kept its last tokens
    assert tensors["responses"][0].tolist() == [7]  # a response keeps its first tokens
    assert non_tensors["is_pad"].tolist() == [False] * 4 + [True] * 4
    assert tensors["response_mask"][4:].sum() == 0 and tensors["attention_mask"][4:].sum() == 4
    assert len(set(non_tensors["uid"][4:])) == 4


def test_fixed_widths_in_the_recipe_leave_out_steps_that_do_not_fit():
    recipe = Recipe(name="grpo", group_size=2, groups_per_batch=1, filters={"min_quality": 0},
                    prompt_length=23, layout="step")  # fmt: skip
    curated, steps = _curated(_two_step_group(), {"a": 1.0, "b": 1.0, "c": 0.0})
    plan = plan_batch(recipe, curated, steps, None, at(60))
    assert "prompt_too_long" in plan.dropped.filter(pl.col("turn_id") == "a1")["reason"].to_list()
    assert set(plan.rows["trajectory_id"]) == {"b", "c"}
    tensors, _ = verl_arrays(plan.rows, VerlLayout(prompt_length=23))
    assert tensors["prompts"].shape[1] == 23
