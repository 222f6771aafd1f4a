"""verl DataProto layout: one row per step, as Claw-R1's VerlBackend builds it.

Tensors (``batch.parquet``: one fixed-width array column per tensor, so
``pl.read_parquet(path)[name].to_numpy()`` is the [B, width] array): ``prompts`` [B, P]
left-padded, ``responses`` [B, R] right-padded,
``input_ids`` = cat(prompts, responses), ``attention_mask`` (1 on real tokens),
``position_ids`` (cumsum of the attention mask - 1, 0 on padding), ``response_mask`` (1 on
response tokens: every token of a step's response is an action), ``rollout_log_probs`` [B, R]
(0.0 on padding; only when every row has aligned logprobs), ``rm_scores`` and
``token_level_scores`` [B, R] with the credited step reward at the last valid response token.
Non-tensor (``non_tensor.parquet``, one row per tensor row): ``uid`` (= group_id, the
GRPO/RLOO group key; trajectory_id when a step has no group), ``trajectory_uids``,
``step_indices``, ``turn_ids``, ``is_last``, ``policy_version``, ``data_source``,
``ground_truth``, ``__num_turns__``. Load with ``DataProto.from_dict(tensors=...,
non_tensors=...)``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.padding import left_mask, lengths, pad, right_mask
from claw_pipelines.transforms.messages import claw_field


def verl_tensors(rows: pl.DataFrame, *, pad_token_id: int = 0) -> dict[str, np.ndarray]:
    """The DataProto ``batch`` tensors of ``rows`` (BATCH_ROWS), padded to the batch maxima."""
    prompts, responses = rows["prompt_token_ids"], rows["response_token_ids"]
    prompt_len, response_len = lengths(prompts), lengths(responses)
    width_p = int(prompt_len.max(initial=0))
    width_r = int(response_len.max(initial=0))
    prompt_ids = pad(prompts, width_p, pad_token_id, np.int64, left=True)
    response_ids = pad(responses, width_r, pad_token_id, np.int64, left=False)
    response_mask = right_mask(response_len, width_r)
    attention = np.concatenate([left_mask(prompt_len, width_p), response_mask], axis=1)
    scores = np.zeros((rows.height, width_r), dtype=np.float32)
    has_tokens = response_len > 0
    reward = rows["reward"].fill_null(0.0).to_numpy().astype(np.float32)
    scores[np.flatnonzero(has_tokens), response_len[has_tokens] - 1] = reward[has_tokens]
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": np.concatenate([prompt_ids, response_ids], axis=1),
        "attention_mask": attention,
        "position_ids": np.clip(np.cumsum(attention, axis=1) - 1, 0, None),
        "response_mask": response_mask,
        "rm_scores": scores,
        "token_level_scores": scores.copy(),
    }
    logprobs = rows["response_logprobs"]
    if logprobs.null_count() == 0 and np.array_equal(lengths(logprobs), response_len):
        tensors["rollout_log_probs"] = pad(logprobs, width_r, 0.0, np.float32, left=False)
    return tensors


def verl_non_tensors(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.select(
        pl.coalesce("group_id", "trajectory_id").alias("uid"),
        pl.col("trajectory_id").alias("trajectory_uids"),
        pl.col("step_index").alias("step_indices"),
        pl.col("turn_id").alias("turn_ids"),
        "is_last",
        "policy_version",
        claw_field("data_source").alias("data_source"),
        claw_field("ground_truth").alias("ground_truth"),
        pl.col("num_steps").alias("__num_turns__"),
    )


def write_verl(rows: pl.DataFrame, out: Destination, *, pad_token_id: int) -> list[tuple[str, str]]:
    """Write ``verl/batch.parquet`` and ``verl/non_tensor.parquet``; return (path, description)."""
    tensors = verl_tensors(rows, pad_token_id=pad_token_id)
    columns = [pl.Series(name, array) for name, array in tensors.items()]
    out.parquet(pl.DataFrame(columns), "verl/batch.parquet")
    out.parquet(verl_non_tensors(rows), "verl/non_tensor.parquet")
    return [
        ("verl/batch.parquet", f"DataProto tensors: {', '.join(sorted(tensors))}"),
        ("verl/non_tensor.parquet", "DataProto non_tensor_batch (uid = group_id), row-aligned"),
    ]
