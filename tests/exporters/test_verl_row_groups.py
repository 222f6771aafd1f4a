"""The verl export writes its padded tensors a bounded row group at a time: the files must hold
exactly the arrays the whole batch builds (``verl_arrays``, what ``Batch.to_verl`` gives)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from claw_pipelines.batches.manifest import VerlLayout
from claw_pipelines.derived_schemas import SEQUENCE_ROWS, fit
from claw_pipelines.exporters import verl
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.verl import TensorShape, VerlFiles, verl_arrays


def _lists(lengths: np.ndarray, values: np.ndarray) -> list[list]:
    ends = np.cumsum(lengths)
    return [values[end - n : end].tolist() for n, end in zip(lengths, ends, strict=True)]


def _sequences(count: int, seed: int) -> pl.DataFrame:
    """``count`` sequence rows of 1-40 prompt and 1-24 response tokens, two per group."""
    rng = np.random.default_rng(seed)
    prompt, response = rng.integers(1, 41, count), rng.integers(1, 25, count)
    ids = [f"{seed}-{i}" for i in range(count)]
    rows = pl.DataFrame(
        {
            "batch_id": ["b"] * count,
            "group_id": [f"g{seed}-{i // 2}" for i in range(count)],
            "trajectory_id": ids,
            "turn_id": ids,
            "segment_index": [0] * count,
            "first_step_index": [0] * count,
            "segment_steps": [3] * count,
            "is_last": [True] * count,
            "prompt_token_ids": _lists(prompt, rng.integers(1, 1000, prompt.sum())),
            "response_token_ids": _lists(response, rng.integers(1, 1000, response.sum())),
            "response_mask": _lists(response, rng.integers(0, 2, response.sum())),
            "response_logprobs": _lists(response, -rng.random(response.sum())),
            "reward": rng.random(count),
            "advantage": rng.standard_normal(count),
            "model": ["m"] * count,
        }
    )
    return fit(rows, SEQUENCE_ROWS)


def _exported(tmp_path, chunks: list[pl.DataFrame], layout: VerlLayout):
    out = Destination(str(tmp_path))
    with VerlFiles(out, layout) as files:
        for chunk in chunks:
            files.write(chunk)
        listed = files.finish()
    return listed, tmp_path / "verl" / "batch.parquet", tmp_path / "verl" / "non_tensor.parquet"


@pytest.mark.parametrize(
    "layout",
    [
        VerlLayout(prompt_length=32, response_length=16, truncation="left", pad_to_multiple=4),
        VerlLayout(pad_to_multiple=4, pad_token_id=7),  # widths: the batch's longest row
    ],
    ids=["fixed_widths", "longest_row"],
)
def test_the_export_writes_bounded_row_groups_that_equal_the_whole_batch(
    tmp_path, monkeypatch, layout
):
    chunks = [_sequences(5, 1), _sequences(6, 2)]
    whole_tensors, whole_non_tensors = verl_arrays(pl.concat(chunks), layout)
    shape = TensorShape.of(pl.concat(chunks), layout)
    row_bytes = sum(w * np.dtype(d).itemsize for w, d in shape.columns().values())
    monkeypatch.setattr(verl, "GROUP_BYTES", 3 * row_bytes + 1)  # three rows a group

    listed, batch_file, non_tensor_file = _exported(tmp_path, chunks, layout)

    metadata = pq.ParquetFile(batch_file).metadata
    groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert groups == [3, 3, 3, 3]  # 11 rows and one padding row
    stored = pl.read_parquet(batch_file)
    assert stored.columns == list(whole_tensors)
    for name, array in whole_tensors.items():
        read = stored[name].to_numpy()
        assert read.dtype == array.dtype and read.shape == array.shape, name
        np.testing.assert_array_equal(read, array, err_msg=name)
    non_tensors = pl.read_parquet(non_tensor_file)
    assert non_tensors["is_pad"].to_list() == [False] * 11 + [True]
    for name, column in whole_non_tensors.items():
        assert non_tensors[name].to_list() == column.tolist(), name
    assert [(path, rows) for path, _, rows in listed] == [
        ("verl/batch.parquet", 12),
        ("verl/non_tensor.parquet", 12),
    ]
    first = chunks[0].row(0, named=True)  # the arrays hold the row's own tokens
    width_p = whole_tensors["prompts"].shape[1]
    prompt = first["prompt_token_ids"][-width_p:]
    assert whole_tensors["prompts"][0, width_p - len(prompt) :].tolist() == prompt


def test_a_tensor_only_some_rows_have_is_left_out_of_the_whole_file(tmp_path):
    """Logprobs go in only when every row of the batch has them: a later chunk's row without
    them leaves ``rollout_log_probs`` out of every row group, as the whole batch does."""
    later = _sequences(4, 2).with_columns(
        pl.when(pl.int_range(pl.len()) != 3)
        .then(pl.col("response_logprobs"))
        .alias("response_logprobs")
    )
    chunks = [_sequences(4, 1), later]
    layout = VerlLayout(prompt_length=40, response_length=24)
    _, batch_file, _ = _exported(tmp_path, chunks, layout)
    stored = pl.read_parquet(batch_file)
    whole, _ = verl_arrays(pl.concat(chunks), layout)
    assert "rollout_log_probs" not in stored.columns and "rollout_log_probs" not in whole
    assert stored.columns == list(whole) and "advantages" in whole


def test_the_file_takes_the_batch_widths_and_to_verl_the_recipes(tmp_path):
    """``batch.parquet`` is padded to the batch's longest prompt and response, not to the
    recipe's widths (which made a few thousand tokens ~100 MB of arrays): it holds exactly the
    window of ``verl_arrays`` at the recipe's widths (``Batch.to_verl``) where the tokens are."""
    rows = _sequences(5, 1)
    layout = VerlLayout(prompt_length=64, response_length=48, pad_to_multiple=4)
    _, batch_file, _ = _exported(tmp_path, [rows], layout)
    stored = pl.read_parquet(batch_file)
    fixed, _ = verl_arrays(rows, layout)
    width_p = rows["prompt_token_ids"].list.len().max()
    width_r = rows["response_token_ids"].list.len().max()
    assert width_p < 64 and width_r < 48 and fixed["prompts"].shape == (8, 64)
    for name, array in fixed.items():
        read = stored[name].to_numpy()
        if array.shape[1] == 64:  # left-padded: the prompt's last columns
            window = array[:, 64 - width_p :]
        elif array.shape[1] == 48:  # right-padded: the response's first columns
            window = array[:, :width_r]
        else:  # prompt then response
            window = array[:, 64 - width_p : 64 + width_r]
        assert read.dtype == array.dtype, name
        np.testing.assert_array_equal(read, window, err_msg=name)
