"""verl DataProto layout, as verl's agent loop and Claw-R1's VerlBackend build it: one row per
segment of a trajectory in the ``sequence`` layout (``transforms.sequences``), one per step in
the ``step`` layout.

Tensors (``batch.parquet``: one fixed-width array column per tensor, so
``pl.read_parquet(path)[name].to_numpy()`` is the [B, width] array): ``prompts`` [B, P]
left-padded (a sequence's first prompt), ``responses`` [B, R] right-padded (a sequence's
replies and observations), ``input_ids`` = cat(prompts, responses), ``attention_mask`` (1 on
real tokens), ``position_ids`` (cumsum of the attention mask - 1, 0 on padding),
``response_mask`` (1 on the policy's tokens: a sequence's replies, 0 on its observations; every
response token of a step), ``rollout_log_probs`` [B, R] (0.0 on observations and padding; only
when every row has aligned logprobs), ``rm_scores`` and ``token_level_scores`` [B, R] with the
row's credited reward (a sequence's: its last step's) at its last policy token, so verl's
outcome estimators count it once (a sequence's per-step rewards are in ``spans``), and, when
the recipe takes group statistics per trajectory, ``advantages`` and ``returns`` [B, R] (the
row's advantage on every policy token). Token tensors are int64, the rest float32, as verl's
agent loop makes them.

Non-tensor (``non_tensor.parquet``, one row per tensor row): ``uid`` (= group_id, the GRPO/RLOO
group key; trajectory_id when a row has no group), ``trajectory_uids``, ``segment_indices``,
``step_indices`` (a sequence's first step), ``turn_ids`` (its last step's turn), ``spans`` (a
sequence's steps as JSON: step_index, turn_id, [start, end) of the response, reward),
``is_last``, ``is_pad``, ``policy_version``, ``tokenizer`` (the model whose tokenizer made the
IDs), ``data_source``, ``ground_truth``, ``truncated`` (what the recipe's truncation cut, null
when nothing), ``__num_turns__`` (verl's count: the prompt, each reply and each observation
between replies) and ``batch_keys`` (``{uid}_{session}_{segment or step}``, the key verl's
multi-output agent loop gives each output, session = the trajectory's place in its group), which
verl's ``compute_advantage_for_multi_trajectories`` reads to take GRPO statistics per trajectory
across its segments. Load with ``DataProto.from_dict(tensors=..., non_tensors=...)``.

Widths are the recipe's (``Recipe.widths``: ``prompt_length`` / ``response_length``, else its
length filters), so batches concatenate; a recipe with neither gets each batch's longest row.
Rows are padded to ``pad_to_multiple`` (data-parallel ranks, ``chunk``) with rows that carry no
loss: response_mask 0, one attended pad token (no empty sequence reaches an attention kernel),
a uid of their own.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from claw_pipelines.batches.manifest import VerlLayout
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.padding import left_mask, lengths, pad, right_mask
from claw_pipelines.transforms.messages import claw_field
from claw_pipelines.transforms.sequences import is_sequence

PAD_UID = "__pad__"

RESPONSE_LISTS = ["response_token_ids", "response_mask", "response_logprobs"]
"""The per-token lists of a row's response, cut together when it is too long."""


def _widths(rows: pl.DataFrame, layout: VerlLayout) -> tuple[int, int]:
    width_p = layout.prompt_length or int(lengths(rows["prompt_token_ids"]).max(initial=0))
    width_r = layout.response_length or int(lengths(rows["response_token_ids"]).max(initial=0))
    return width_p, width_r


def fitted(rows: pl.DataFrame, layout: VerlLayout) -> pl.DataFrame:
    """``rows`` cut to the layout's widths by its truncation rule ("left" keeps a prompt's last
    tokens, "right" its first; a response keeps its first), its per-token lists cut together,
    with ``truncated`` saying what was cut (null: nothing); "error" raises, naming the first
    row too long. Logprobs not aligned with their reply are dropped first (null). Rows fitted
    already keep their ``truncated``."""
    width_p, width_r = _widths(rows, layout)
    prompt_len = pl.col("prompt_token_ids").list.len()
    response_len = pl.col("response_token_ids").list.len()
    aligned = pl.col("response_logprobs").list.len() == response_len
    rows = rows.with_columns(
        pl.when(aligned).then(pl.col("response_logprobs")).alias("response_logprobs")
    )
    too_long = (prompt_len > width_p) | (response_len > width_r)
    if not rows.select(too_long.fill_null(False).any()).item():
        if "truncated" in rows.columns:
            return rows
        return rows.with_columns(pl.lit(None, pl.String).alias("truncated"))
    if layout.truncation == "error":
        row = rows.filter(too_long).row(0, named=True)
        raise ValueError(
            f"turn {row['turn_id']}: {len(row['prompt_token_ids'])} prompt and "
            f"{len(row['response_token_ids'])} response tokens do not fit the widths {width_p} "
            f"and {width_r}; give larger widths or a recipe truncation of left / right"
        )
    kept = "last" if layout.truncation == "left" else "first"
    why = pl.concat_str(
        pl.when(prompt_len > width_p).then(
            pl.format(f"prompt {{}} tokens > {width_p}: kept its {kept} ones", prompt_len)
        ),
        pl.when(response_len > width_r).then(
            pl.format(f"response {{}} tokens > {width_r}: kept its first ones", response_len)
        ),
        separator="; ",
        ignore_nulls=True,
    )
    prompt = pl.col("prompt_token_ids")
    prompt = prompt.list.tail(width_p) if kept == "last" else prompt.list.head(width_p)
    return rows.with_columns(
        pl.when(why != "").then(why).alias("truncated"),
        prompt,
        *(pl.col(c).list.head(width_r) for c in RESPONSE_LISTS if c in rows.columns),
    )


def _scores(rows: pl.DataFrame, response_mask: np.ndarray) -> np.ndarray:
    """[B, R] with the row's credited reward at its last policy token: the token-level scores
    verl's outcome estimators sum to a row's score, so each row counts its reward once (a
    sequence's per-step rewards are its ``spans``)."""
    scores = np.zeros(response_mask.shape, dtype=np.float32)
    has_tokens = response_mask.any(axis=1)
    last = response_mask.shape[1] - 1 - np.argmax(response_mask[:, ::-1], axis=1)
    reward = rows["reward"].fill_null(0.0).to_numpy().astype(np.float32)
    scores[np.flatnonzero(has_tokens), last[has_tokens]] = reward[has_tokens]
    return scores


def verl_tensors(rows: pl.DataFrame, layout: VerlLayout | None = None) -> dict[str, np.ndarray]:
    """The DataProto ``batch`` tensors of ``rows`` (``BATCH_ROWS`` or ``SEQUENCE_ROWS``),
    without padding rows."""
    layout = layout or VerlLayout()
    width_p, width_r = _widths(rows, layout)
    rows = fitted(rows, layout)
    prompt_len, response_len = (
        lengths(rows["prompt_token_ids"]),
        lengths(rows["response_token_ids"]),
    )
    pad_id = layout.pad_token_id
    prompt_ids = pad(rows["prompt_token_ids"], width_p, pad_id, np.int64, left=True)
    response_ids = pad(rows["response_token_ids"], width_r, pad_id, np.int64, left=False)
    attended = right_mask(response_len, width_r)
    if is_sequence(rows):
        response_mask = pad(rows["response_mask"], width_r, 0, np.int64, left=False)
    else:
        response_mask = attended
    attention = np.concatenate([left_mask(prompt_len, width_p), attended], axis=1)
    scores = _scores(rows, response_mask)
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
    if logprobs.null_count() == 0:
        tensors["rollout_log_probs"] = pad(logprobs, width_r, 0.0, np.float32, left=False)
    if "advantage" in rows.columns and rows["advantage"].null_count() == 0 and rows.height:
        advantage = rows["advantage"].to_numpy().astype(np.float32)[:, None] * response_mask
        tensors["advantages"] = advantage.astype(np.float32)
        tensors["returns"] = tensors["advantages"].copy()
    return tensors


def verl_non_tensors(rows: pl.DataFrame, layout: VerlLayout | None = None) -> pl.DataFrame:
    """The DataProto ``non_tensor_batch`` of ``rows``, row-aligned with ``verl_tensors``."""
    truncated = fitted(rows, layout or VerlLayout()).get_column("truncated")
    rows = rows.drop("truncated", strict=False)
    uid = pl.coalesce("group_id", "trajectory_id")
    session = pl.col("trajectory_id").rank("dense").over(uid) - 1
    if is_sequence(rows):
        part, first_step, turns = "segment_index", "first_step_index", "segment_steps"
        spans = pl.col("spans").map_batches(_json_lists, return_dtype=pl.String)
    else:
        part, first_step, turns = "step_index", "step_index", "num_steps"
        spans = pl.lit(None, pl.String)
    return rows.select(
        uid.alias("uid"),
        pl.col("trajectory_id").alias("trajectory_uids"),
        pl.col("segment_index").fill_null(0).cast(pl.Int32).alias("segment_indices"),
        pl.col(first_step).cast(pl.Int32).alias("step_indices"),
        pl.col("turn_id").alias("turn_ids"),
        spans.alias("spans"),
        "is_last",
        pl.lit(False).alias("is_pad"),
        "policy_version",
        pl.col("model").alias("tokenizer"),
        claw_field("data_source").alias("data_source"),
        claw_field("ground_truth").alias("ground_truth"),
        truncated.alias("truncated"),
        (pl.col(turns) * 2).cast(pl.Int32).alias("__num_turns__"),
        pl.format("{}_{}_{}", uid, session, part).alias("batch_keys"),
    )


def _json_lists(spans: pl.Series) -> pl.Series:
    """Each row's list of span structs as one JSON text (a non-tensor holds flat values)."""
    items = spans.list.eval(pl.element().struct.json_encode()).list.join(",")
    return ("[" + items + "]").rename(spans.name)


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
            "segment_indices": pl.Series([0] * count, dtype=pl.Int32),
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


def padded(
    rows: pl.DataFrame, layout: VerlLayout | None = None
) -> tuple[dict[str, np.ndarray], pl.DataFrame]:
    """The tensors and the non-tensor frame of ``rows``, padded to ``layout.pad_to_multiple``
    rows with rows that carry no loss."""
    layout = layout or VerlLayout()
    rows = fitted(rows, layout)  # once: the tensors and the non-tensors take the rows as cut
    tensors = verl_tensors(rows, layout)
    non_tensors = verl_non_tensors(rows, layout)
    extra = -rows.height % layout.pad_to_multiple
    if extra:
        padding = _padding_rows(tensors, extra, layout.pad_token_id)
        tensors = {name: np.concatenate([array, padding[name]]) for name, array in tensors.items()}
        non_tensors = pl.concat([non_tensors, _padding_non_tensors(extra)], how="diagonal_relaxed")
    return {name: np.ascontiguousarray(array) for name, array in tensors.items()}, non_tensors


def verl_arrays(
    rows: pl.DataFrame, layout: VerlLayout | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(tensors, non_tensors)`` of ``rows`` for ``DataProto.from_dict``, padded to
    ``layout.pad_to_multiple`` rows with rows that carry no loss."""
    tensors, non_tensors = padded(rows, layout)
    columns = {name: _object_or_native(non_tensors[name]) for name in non_tensors.columns}
    return tensors, columns


def write_verl(
    rows: pl.DataFrame, out: Destination, layout: VerlLayout | None = None
) -> list[tuple[str, str, int]]:
    """Write ``verl/batch.parquet`` and ``verl/non_tensor.parquet`` (padded as ``padded``);
    (path, description, rows) of each."""
    tensors, non_tensors = padded(rows, layout)
    columns = [pl.Series(name, array) for name, array in tensors.items()]
    out.parquet(pl.DataFrame(columns), "verl/batch.parquet")
    out.parquet(non_tensors, "verl/non_tensor.parquet")
    return [
        (
            "verl/batch.parquet",
            f"DataProto tensors: {', '.join(sorted(tensors))}",
            non_tensors.height,
        ),
        (
            "verl/non_tensor.parquet",
            "DataProto non_tensor_batch (uid = group_id), row-aligned",
            non_tensors.height,
        ),
    ]


class VerlFiles:
    """A batch's verl files. Its tensors are built whole (widths may be the batch's longest
    row, and padding rows come last), so the chunks of rows are kept and written together when
    the batch is complete."""

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
