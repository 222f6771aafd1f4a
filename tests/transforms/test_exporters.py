"""Exporters: verl tensor shapes, padding, masks and reward position; TRL and JSONL files."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from transform_rows import SYSTEM, at, event, events, rewards, turn, turns

from claw_pipelines.batches.manifest import VerlLayout
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching.planner import plan_batch
from claw_pipelines.exporters import Destination, export_batch
from claw_pipelines.exporters.verl import verl_tensors
from claw_pipelines.transforms import (
    QualityConfig,
    curate_steps,
    extract_steps,
    reward_steps,
    score_steps,
)
from claw_pipelines.transforms.reward_rules import RewardConfig

META = json.dumps({"claw": {"ground_truth": "4", "data_source": "math"}})


def _curated(rows: list[dict], values: dict[str, float]):
    """Curated steps of ``rows`` whose trajectories completed with ``values``, and the steps."""
    landed = rewards(*[{"trajectory_id": t, "value": v} for t, v in values.items()])
    steps = extract_steps(turns(*rows), None, events(*[event(t) for t in values]), now=at(50)).steps
    curated = curate_steps(
        score_steps(reward_steps(steps, landed, None, RewardConfig()), steps, QualityConfig()),
        None,
    )
    return curated, steps


def _plan(recipe: Recipe, rows: list[dict], values: dict[str, float]):
    curated, steps = _curated(rows, values)
    return plan_batch(recipe, curated, steps, None, at(60), source_versions={"curated_steps": 5})


def _grpo_plan():
    messages = json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}])
    rows = [
        turn("a0", [*SYSTEM, 1], [7, 8, 9], trajectory_id="a", group_id="g", metadata=META,
             request_messages=messages),
        turn("a1", [*SYSTEM, 1, 7, 8, 9, 3], [4], trajectory_id="a", group_id="g", start=2,
             metadata=META, request_messages=messages, response_logprobs=None),
        turn("b0", [*SYSTEM, 1], [5], trajectory_id="b", group_id="g", start=1, metadata=META,
             request_messages=messages),
    ]  # fmt: skip
    recipe = Recipe(name="grpo", group_size=2, groups_per_batch=1, filters={"min_quality": 0},
                    layout="step", pad_to_multiple=1)  # fmt: skip
    return recipe, _plan(recipe, rows, {"a": 1.0, "b": 0.0})


def test_verl_tensors_pad_mask_and_place_the_reward():
    _, plan = _grpo_plan()
    rows = plan.rows
    assert rows["turn_id"].to_list() == ["a0", "a1", "b0"]
    layout = VerlLayout(pad_token_id=99)
    t = verl_tensors(rows.with_columns(pl.Series("reward", [0.5, 1.0, 0.0])), layout)
    assert t["prompts"].shape == (3, 25) and t["responses"].shape == (3, 3)
    assert t["input_ids"].shape == t["attention_mask"].shape == t["position_ids"].shape == (3, 28)
    assert (t["prompts"][0, :4] == 99).all() and t["prompts"][0, 4:].tolist() == [*SYSTEM, 1]
    assert t["responses"][1].tolist() == [4, 99, 99]
    assert t["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert t["attention_mask"][0].tolist() == [0] * 4 + [1] * 21 + [1, 1, 1]
    assert t["position_ids"][0].tolist() == [0] * 5 + list(range(1, 24))
    assert t["position_ids"][1, -3:].tolist() == [25, 25, 25]
    assert t["rm_scores"].tolist() == [[0, 0, 0.5], [1.0, 0, 0], [0, 0, 0]]
    assert "rollout_log_probs" not in t
    full = verl_tensors(rows.filter(pl.col("turn_id") != "a1"))
    assert full["rollout_log_probs"].dtype == np.float32
    assert full["rollout_log_probs"][0].tolist() == [-0.5, -0.5, -0.5]


def test_export_writes_every_format_and_a_manifest(tmp_path):
    recipe, plan = _grpo_plan()
    manifest = export_batch(
        recipe, plan.rows, Destination(str(tmp_path)), source_versions={"curated_steps": 5}
    )
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written == manifest.model_dump()
    assert (manifest.batch_id, manifest.rows, manifest.source_versions) == (
        "grpo-000001",
        3,
        {"curated_steps": 5},
    )
    assert {f.path for f in manifest.files} == {
        "verl/batch.parquet", "verl/non_tensor.parquet", "trl/prompts.parquet",
        "trl/rollouts.parquet", "jsonl/steps.jsonl", "jsonl/trajectories.jsonl",
    }  # fmt: skip
    for f in manifest.files:
        assert (tmp_path / f.path).exists()
    non_tensor = pl.read_parquet(tmp_path / "verl/non_tensor.parquet")
    assert non_tensor["uid"].to_list() == ["g", "g", "g"]
    assert non_tensor["ground_truth"].to_list() == ["4"] * 3
    tensors = pl.read_parquet(tmp_path / "verl/batch.parquet")
    expected = verl_tensors(plan.rows.sort("group_id", "trajectory_id", "step_index"))
    assert set(tensors.columns) == set(expected)
    for name, array in expected.items():
        loaded = tensors[name].to_numpy()  # what a trainer hands to torch.from_numpy
        assert loaded.dtype == array.dtype and np.array_equal(loaded, array), name
    prompts = pl.read_parquet(tmp_path / "trl/prompts.parquet")
    assert prompts.height == 1
    assert prompts["prompt"][0].to_list()[1]["content"] == "2+2?"
    assert (prompts["ground_truth"][0], prompts["data_source"][0]) == ("4", "math")
    lines = (tmp_path / "jsonl/trajectories.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert [s["turn_id"] for s in first["steps"]] == ["a0", "a1"]


def test_sft_and_dpo_exports(tmp_path):
    tool = json.dumps(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
            ],
        }
    )
    parts = json.dumps([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    rows = [turn("s0", [*SYSTEM, 1], [5, 6], trajectory_id="s", response_message=tool,
                 request_messages=parts)]  # fmt: skip
    sft = Recipe(name="sft", algorithm="sft", group_size=1, groups_per_batch=1, exports=["trl"])
    plan = _plan(sft, rows, {"s": 1.0})
    export_batch(sft, plan.rows, Destination(str(tmp_path / "sft")))
    tokens = pl.read_parquet(tmp_path / "sft/trl/sft_tokens.parquet")
    assert tokens["input_ids"][0].to_list() == [*SYSTEM, 1, 5, 6]
    assert tokens["completion_mask"][0].to_list() == [0] * 21 + [1, 1]
    chat = pl.read_parquet(tmp_path / "sft/trl/sft_messages.parquet")["messages"][0].to_list()
    assert chat[0]["content"] == "hi"
    assert chat[1]["tool_calls"][0]["function"]["name"] == "calc"

    prompt = [*SYSTEM, 2]
    pair_rows = [
        turn("good", prompt, [1], trajectory_id="t1", group_id="g"),
        turn("bad", prompt, [2], trajectory_id="t2", group_id="g", start=1),
    ]
    dpo = Recipe(name="dpo", algorithm="dpo", groups_per_batch=1, min_reward_gap=0.5)
    plan = _plan(dpo, pair_rows, {"t1": 1.0, "t2": 0.0})
    manifest = export_batch(dpo, plan.rows, Destination(str(tmp_path / "dpo")))
    assert {f.path for f in manifest.files} == {
        "trl/preference.parquet", "trl/preference_tokens.parquet", "jsonl/pairs.jsonl",
    }  # fmt: skip
    preference = pl.read_parquet(tmp_path / "dpo/trl/preference.parquet")
    assert preference["chosen"][0].to_list()[0]["content"] == "a-good"
    assert preference["rejected"][0].to_list()[0]["content"] == "a-bad"


def test_a_multi_step_trajectory_is_one_conversation_and_keeps_its_outcome(tmp_path):
    first = [{"role": "user", "content": "2+2?"}]
    second = [*first, {"role": "assistant", "content": "a-s0"}, {"role": "tool", "content": "4"}]
    rows = [
        turn("s0", [*SYSTEM, 1], [7, 8], trajectory_id="s", request_messages=json.dumps(first)),
        turn("s1", [*SYSTEM, 1, 7, 8, 3], [4], trajectory_id="s", start=2,
             request_messages=json.dumps(second)),
    ]  # fmt: skip
    sft = Recipe(name="sft", algorithm="sft", group_size=1, groups_per_batch=1,
                 credit_assignment={"method": "broadcast"}, exports=["trl", "jsonl"])  # fmt: skip
    plan = _plan(sft, rows, {"s": 1.0})
    export_batch(sft, plan.rows, Destination(str(tmp_path)))
    chats = pl.read_parquet(tmp_path / "trl/sft_messages.parquet")
    assert chats.height == 1
    assert [m["content"] for m in chats["messages"][0].to_list()] == ["2+2?", "a-s0", "4", "a-s1"]
    (tokens,) = pl.read_parquet(tmp_path / "trl/sft_tokens.parquet").iter_rows(named=True)
    assert tokens["input_ids"] == [*SYSTEM, 1, 7, 8, 3, 4]  # one sequence, the reply trained once
    assert tokens["completion_mask"] == [0] * 21 + [1, 1, 0, 1]  # the tool output is no target
    (line,) = (tmp_path / "jsonl/trajectories.jsonl").read_text().splitlines()
    trajectory = json.loads(line)
    (sequence,) = trajectory["sequences"]
    assert [s["reward"] for s in sequence["spans"]] == [1.0, 1.0]  # broadcast
    assert trajectory["reward"] == 1.0


CALCULATOR = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def test_trl_datasets_carry_the_tools_the_requests_declared(tmp_path):
    tools = json.dumps(CALCULATOR)
    rows = [
        turn("a0", [*SYSTEM, 1], [7], trajectory_id="a", group_id="g", request_tools=tools),
        turn("b0", [*SYSTEM, 1], [8], trajectory_id="b", group_id="g", start=1,
             request_tools=tools),
        turn("c0", [*SYSTEM, 2], [7], trajectory_id="c", group_id="h", start=2),
        turn("d0", [*SYSTEM, 2], [8], trajectory_id="d", group_id="h", start=3),
    ]  # fmt: skip
    grpo = Recipe(name="grpo", group_size=2, groups_per_batch=2, filters={"min_quality": 0})
    plan = _plan(grpo, rows, {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0})
    export_batch(grpo, plan.rows, Destination(str(tmp_path / "grpo")))
    prompts = pl.read_parquet(tmp_path / "grpo/trl/prompts.parquet")
    assert dict(prompts.select("group_id", "tools").iter_rows()) == {"g": tools, "h": None}
    assert json.loads(prompts["tools"][0]) == CALCULATOR  # what TRL's json.loads hands the template
    non_tensor = pl.read_parquet(tmp_path / "grpo/verl/non_tensor.parquet")
    assert non_tensor.columns == [
        "uid", "trajectory_uids", "segment_indices", "step_indices", "turn_ids", "spans",
        "is_last", "is_pad", "policy_version", "tokenizer", "data_source", "ground_truth",
        "truncated", "__num_turns__", "batch_keys",
    ]  # fmt: skip

    dpo = Recipe(name="dpo", algorithm="dpo", groups_per_batch=1, min_reward_gap=0.5)
    plan = _plan(dpo, rows[:2], {"a": 1.0, "b": 0.0})
    export_batch(dpo, plan.rows, Destination(str(tmp_path / "dpo")))
    preference = pl.read_parquet(tmp_path / "dpo/trl/preference.parquet")
    assert preference["tools"].to_list() == [tools]

    sft = Recipe(name="sft", algorithm="sft", group_size=1, groups_per_batch=2, exports=["trl"])
    plan = _plan(sft, [rows[0], rows[2]], {"a": 1.0, "c": 1.0})
    export_batch(sft, plan.rows, Destination(str(tmp_path / "sft")))
    chats = pl.read_parquet(tmp_path / "sft/trl/sft_messages.parquet")
    assert dict(chats.select("trajectory_id", "tools").iter_rows()) == {"a": tools, "c": None}


def test_batches_from_steps_written_before_request_tools_have_no_tools():
    """A batch re-planned from a pinned ``steps`` version that predates the column."""
    tools = json.dumps(CALCULATOR)
    rows = [turn(t, [*SYSTEM, 1], [i], trajectory_id=t, group_id="g", start=i,
                 request_tools=tools) for i, t in enumerate(["a", "b"])]  # fmt: skip
    recipe = Recipe(name="grpo", group_size=2, groups_per_batch=1, filters={"min_quality": 0})
    curated, steps = _curated(rows, {"a": 1.0, "b": 0.0})
    assert set(plan_batch(recipe, curated, steps, None, at(60)).rows["request_tools"]) == {tools}
    older = plan_batch(recipe, curated, steps.drop("request_tools"), None, at(60)).rows
    assert older.height == 2 and older["request_tools"].null_count() == 2
    assert older["prompt_token_ids"].null_count() == 0


def test_a_large_export_file_is_written_in_row_groups_of_about_row_group_bytes(
    tmp_path, monkeypatch
):
    """pyarrow buffers a whole row group: one of a batch of every turn would be hundreds of MB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from claw_pipelines.exporters import destination

    tokens = pa.array([list(range(i, i + 64)) for i in range(1000)], pa.list_(pa.int32()))
    table = pa.table({"prompt_ids": tokens, "group_id": [f"g{i // 4}" for i in range(1000)]})
    monkeypatch.setattr(destination, "ROW_GROUP_BYTES", table.nbytes // 10)
    Destination(str(tmp_path)).arrow_parquet(table, "trl/rollouts.parquet")
    written = pq.ParquetFile(tmp_path / "trl/rollouts.parquet")
    assert 9 <= written.metadata.num_row_groups <= 11
    assert written.read().equals(table)


def test_a_batch_exported_in_chunks_writes_the_files_of_one_export(tmp_path):
    """A large batch is exported a chunk of whole groups at a time (``export_chunks``): every
    file and the manifest must be what the batch exported whole gives, so a trainer reads the
    same batch however it was written."""
    import pyarrow.parquet as pq

    from claw_pipelines.batches.rows import in_export_order
    from claw_pipelines.exporters import export_chunks

    tools = json.dumps(CALCULATOR)
    question = json.dumps([{"role": "user", "content": "2+2?"}])
    rows = [
        turn("a0", [*SYSTEM, 1], [7, 8], trajectory_id="a", group_id="g", request_tools=tools,
             request_messages=question, metadata=META),
        turn("a1", [*SYSTEM, 1, 7, 8, 3], [4], trajectory_id="a", group_id="g", start=2,
             request_tools=tools),
        turn("b0", [*SYSTEM, 1], [9], trajectory_id="b", group_id="g", start=1,
             request_tools=tools),
        turn("c0", [*SYSTEM, 2], [7], trajectory_id="c", group_id="h", start=3),
        turn("d0", [*SYSTEM, 2], [8], trajectory_id="d", group_id="h", start=4),
        turn("e0", [*SYSTEM, 3], [5], trajectory_id="e", group_id="k", start=5),
        turn("f0", [*SYSTEM, 3], [6], trajectory_id="f", group_id="k", start=6),
    ]  # fmt: skip
    recipe = Recipe(name="grpo", group_size=2, groups_per_batch=3, filters={"min_quality": 0})
    plan = _plan(recipe, rows, {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0, "e": 0.5, "f": 0.0})
    ordered = in_export_order(recipe.algorithm, plan.rows)
    assert ordered.get_column("group_id").n_unique() == 3
    whole = export_batch(recipe, plan.rows, Destination(str(tmp_path / "whole")))
    chunks = ordered.partition_by("group_id", maintain_order=True)
    chunked = export_chunks(recipe, chunks, Destination(str(tmp_path / "chunked")))
    assert chunked == whole
    for file in whole.files:
        one, parts = tmp_path / "whole" / file.path, tmp_path / "chunked" / file.path
        if file.path.endswith(".parquet"):
            assert pq.read_table(parts).equals(pq.read_table(one), check_metadata=True), file.path
        else:
            assert parts.read_text() == one.read_text(), file.path


def test_a_jsonl_write_larger_than_the_stream_buffer_lands_whole(tmp_path, monkeypatch):
    """delta-rs's store takes only ``bytes``; pyarrow's buffered stream hands a write as large
    as its buffer straight through as a pyarrow Buffer (a chunk of 16k turns is ~100 MB of
    JSON lines against an 8 MiB buffer)."""
    from claw_pipelines.exporters import destination

    monkeypatch.setattr(destination, "STREAM_BUFFER", 64)
    recipe, plan = _grpo_plan()
    jsonl = recipe.model_copy(update={"exports": ["jsonl"]})
    export_batch(jsonl, plan.rows, Destination(str(tmp_path)))
    lines = (tmp_path / "jsonl/steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["turn_id"] for line in lines] == ["a0", "a1", "b0"]
