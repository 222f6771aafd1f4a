"""verl DataProto layout: one row per step, as Claw-R1's VerlBackend and verl's agent loop build it.

Tensors (``batch.parquet``: one fixed-width array column per tensor, so
``pl.read_parquet(path)[name].to_numpy()`` is the [B, width] array): ``prompts`` [B, P]
left-padded, ``responses`` [B, R] right-padded, ``input_ids`` = cat(prompts, responses),
``attention_mask`` (1 on real tokens), ``position_ids`` (cumsum of the attention mask - 1, 0 on
padding), ``response_mask`` (1 on response tokens: every token of a step's response is an
action), ``rollout_log_probs`` [B, R] (0.0 on padding; only when every row has aligned
logprobs), ``rm_scores`` and ``token_level_scores`` [B, R] with the credited step reward at the
last valid response token, and, when the recipe takes group statistics per trajectory,
``advantages`` and ``returns`` [B, R] (the row's advantage on every response token). Token
tensors are int64, the rest float32, as verl's agent loop makes them.

Non-tensor (``non_tensor.parquet``, one row per tensor row): ``uid`` (= group_id, the GRPO/RLOO
group key; trajectory_id when a step has no group), ``trajectory_uids``, ``step_indices``,
``turn_ids``, ``is_last``, ``is_pad``, ``policy_version``, ``data_source``, ``ground_truth``,
``__num_turns__`` (verl's count: the prompt, each reply and each observation between replies,
so ``2 * num_steps``) and ``batch_keys`` (``{uid}_{session}_{step}``, the key verl's multi-output
agent loop gives each output, session = the trajectory's place in its group), which verl's
``compute_advantage_for_multi_trajectories`` reads to take GRPO statistics per trajectory.
Load with ``DataProto.from_dict(tensors=..., non_tensors=...)``.

Widths are the recipe's ``prompt_length`` / ``response_length`` when set (so batches concatenate),
else the batch's longest row. Rows can be padded to a multiple (data-parallel ranks) with rows
that carry no loss: response_mask 0, one attended pad token (no empty sequence reaches an
attention kernel), a uid of their own.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from claw_pipelines.batching.recipe import Truncation
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.padding import left_mask, lengths, pad, right_mask
from claw_pipelines.transforms.messages import claw_field

PAD_UID = "__pad__"


class VerlLayout(BaseModel):
    """How a batch's rows become fixed-width arrays."""

    model_config = ConfigDict(extra="forbid")

    prompt_length: int | None = Field(default=None, ge=1)
    response_length: int | None = Field(default=None, ge=1)
    pad_token_id: int = Field(default=0, ge=0)
    truncation: Truncation = "error"
    pad_to_multiple: int = Field(default=1, ge=1)


def _fitted(rows: pl.DataFrame, column: str, width: int, keep: str, truncation: str) -> pl.Series:
    """``rows[column]`` with every list at most ``width`` long: cut at the ``keep`` end
    ("left" keeps the last tokens), or a ValueError naming the first row too long."""
    lists = rows[column]
    too_long = lists.list.len() > width
    if not too_long.any():
        return lists
    if truncation == "error":
        row = rows.filter(too_long).row(0, named=True)
        raise ValueError(
            f"turn {row['turn_id']}: {column} has {len(row[column])} tokens, more than the width "
            f"{width}; give a larger width or a recipe truncation of left / right"
        )
    return lists.list.tail(width) if keep == "left" else lists.list.head(width)


def verl_tensors(rows: pl.DataFrame, layout: VerlLayout | None = None) -> dict[str, np.ndarray]:
    """The DataProto ``batch`` tensors of ``rows`` (BATCH_ROWS), without padding rows."""
    layout = layout or VerlLayout()
    width_p = layout.prompt_length or int(lengths(rows["prompt_token_ids"]).max(initial=0))
    width_r = layout.response_length or int(lengths(rows["response_token_ids"]).max(initial=0))
    keep_prompt = "left" if layout.truncation == "left" else "right"
    prompts = _fitted(rows, "prompt_token_ids", width_p, keep_prompt, layout.truncation)
    responses = _fitted(rows, "response_token_ids", width_r, "right", layout.truncation)
    prompt_len, response_len = lengths(prompts), lengths(responses)
    pad_id = layout.pad_token_id
    prompt_ids = pad(prompts, width_p, pad_id, np.int64, left=True)
    response_ids = pad(responses, width_r, pad_id, np.int64, left=False)
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
    if logprobs.null_count() == 0 and np.array_equal(
        lengths(logprobs), lengths(rows["response_token_ids"])
    ):
        fitted = logprobs.list.head(width_r)
        tensors["rollout_log_probs"] = pad(fitted, width_r, 0.0, np.float32, left=False)
    if "advantage" in rows.columns and rows["advantage"].null_count() == 0 and rows.height:
        advantage = rows["advantage"].to_numpy().astype(np.float32)[:, None] * response_mask
        tensors["advantages"] = advantage.astype(np.float32)
        tensors["returns"] = tensors["advantages"].copy()
    return tensors


def verl_non_tensors(rows: pl.DataFrame) -> pl.DataFrame:
    uid = pl.coalesce("group_id", "trajectory_id")
    session = pl.col("trajectory_id").rank("dense").over(uid) - 1
    return rows.select(
        uid.alias("uid"),
        pl.col("trajectory_id").alias("trajectory_uids"),
        pl.col("step_index").alias("step_indices"),
        pl.col("turn_id").alias("turn_ids"),
        "is_last",
        pl.lit(False).alias("is_pad"),
        "policy_version",
        claw_field("data_source").alias("data_source"),
        claw_field("ground_truth").alias("ground_truth"),
        (pl.col("num_steps") * 2).cast(pl.Int32).alias("__num_turns__"),
        pl.format("{}_{}_{}", uid, session, "step_index").alias("batch_keys"),
    )


def _padding_rows(tensors: dict[str, np.ndarray], count: int, pad_id: int) -> dict[str, np.ndarray]:
    """``count`` rows that carry no loss, shaped like ``tensors``' rows."""
    width_p = tensors["prompts"].shape[1]
    out = {
        name: np.zeros((count, *array.shape[1:]), array.dtype) for name, array in tensors.items()
    }
    for name in ("prompts", "responses", "input_ids"):
        out[name][:] = pad_id
    out["attention_mask"][:, width_p - 1] = 1  # one pad token: never an empty sequence
    return out


def _padding_non_tensors(count: int) -> pl.DataFrame:
    ids = pl.Series([f"{PAD_UID}{i}" for i in range(count)], dtype=pl.String)
    return pl.DataFrame(
        {
            "uid": ids,
            "trajectory_uids": ids,
            "step_indices": pl.Series([0] * count, dtype=pl.Int32),
            "turn_ids": pl.Series([None] * count, dtype=pl.String),
            "is_last": [True] * count,
            "is_pad": [True] * count,
            "__num_turns__": pl.Series([0] * count, dtype=pl.Int32),
            "batch_keys": ids + "_0_0",
        }
    )


def _object_or_native(series: pl.Series) -> np.ndarray:
    """A non-tensor column as verl keeps it: strings and nullable values as object arrays,
    complete numbers and flags in their own dtype. Always writable (a copy)."""
    if series.dtype in (pl.String, pl.Null) or series.null_count():
        return np.array(series.to_list(), dtype=object)
    return series.to_numpy().copy()


def verl_arrays(
    rows: pl.DataFrame, layout: VerlLayout | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(tensors, non_tensors)`` of ``rows`` for ``DataProto.from_dict``, padded to
    ``layout.pad_to_multiple`` rows with rows that carry no loss."""
    layout = layout or VerlLayout()
    tensors = verl_tensors(rows, layout)
    extra = -rows.height % layout.pad_to_multiple
    non_tensors = verl_non_tensors(rows)
    if extra:
        padding = _padding_rows(tensors, extra, layout.pad_token_id)
        tensors = {name: np.concatenate([array, padding[name]]) for name, array in tensors.items()}
        non_tensors = pl.concat([non_tensors, _padding_non_tensors(extra)], how="diagonal_relaxed")
    columns = {name: _object_or_native(non_tensors[name]) for name in non_tensors.columns}
    return {name: np.ascontiguousarray(array) for name, array in tensors.items()}, columns


def write_verl(
    rows: pl.DataFrame, out: Destination, layout: VerlLayout | None = None
) -> list[tuple[str, str, int]]:
    """Write ``verl/batch.parquet`` and ``verl/non_tensor.parquet``; (path, description, rows)
    of each."""
    tensors = verl_tensors(rows, layout)
    columns = [pl.Series(name, array) for name, array in tensors.items()]
    out.parquet(pl.DataFrame(columns), "verl/batch.parquet")
    out.parquet(verl_non_tensors(rows), "verl/non_tensor.parquet")
    return [
        ("verl/batch.parquet", f"DataProto tensors: {', '.join(sorted(tensors))}", rows.height),
        (
            "verl/non_tensor.parquet",
            "DataProto non_tensor_batch (uid = group_id), row-aligned",
            rows.height,
        ),
    ]


class VerlFiles:
    """A batch's verl files. Its tensors are as wide as the batch's longest row (unless the
    recipe sets widths) and are built whole, so the chunks of rows are kept and written
    together when the batch is complete."""

    def __init__(self, out: Destination, layout: VerlLayout | None) -> None:
        self.out, self.layout = out, layout
        self._chunks: list[pl.DataFrame] = []

    def write(self, rows: pl.DataFrame) -> None:
        self._chunks.append(rows)

    def finish(self) -> list[tuple[str, str, int]]:
        rows = pl.concat(self._chunks)
        self._chunks = []
        return write_verl(rows, self.out, self.layout)

    def __enter__(self) -> VerlFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self._chunks = []
