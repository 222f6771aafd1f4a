"""verl DataProto layout, as verl's agent loop and Claw-R1's VerlBackend build it: one row per
segment of a trajectory in the ``sequence`` layout (``transforms.sequences``), one per step in
the ``step`` layout.

Tensors (``batch.parquet``: one fixed-width array column per tensor, so
``pl.read_parquet(path)[name].to_numpy()`` is the [B, width] array, at the batch's widths):
``prompts`` [B, P] left-padded (a sequence's first prompt), ``responses`` [B, R] right-padded
(a sequence's replies and observations), ``input_ids`` = cat(prompts, responses),
``attention_mask`` (1 on real tokens), ``position_ids`` (cumsum of the attention mask - 1, 0 on
padding),
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

Rows are cut to the recipe's widths (``Recipe.widths``: ``prompt_length`` / ``response_length``,
else its length filters) by its truncation rule. ``verl_arrays`` (``Batch.to_verl``) pads them
to those widths, so a trainer's batches concatenate; a recipe with neither gets each batch's
longest row. ``batch.parquet`` is padded to the batch's own longest prompt and response (within
the recipe's widths; ``manifest.verl_layout`` has the recipe's): padded to 65,536 + 32,768, a
16-row batch of a few thousand tokens was ~100 MB of arrays to build and encode, the largest
cost of a release, where its own widths make the file grow with the batch's tokens. Rows are
padded to ``pad_to_multiple`` (data-parallel ranks, ``chunk``) with rows that carry no loss:
response_mask 0, one attended pad token (no empty sequence reaches an attention kernel), a uid
of their own.

``batch.parquet`` is written a row group of about ``GROUP_BYTES`` of arrays at a time, so
exporting a batch holds its token lists and one row group's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from claw_pipelines.batches.manifest import VerlLayout
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.padding import left_mask, lengths, pad, right_mask
from claw_pipelines.transforms.messages import claw_field
from claw_pipelines.transforms.sequences import is_sequence

PAD_UID = "__pad__"

RESPONSE_LISTS = ["response_token_ids", "response_mask", "response_logprobs"]
"""The per-token lists of a row's response, cut together when it is too long."""

TENSOR_SOURCES = ["prompt_token_ids", *RESPONSE_LISTS, "reward", "advantage"]
"""The columns of a row the tensors are made of."""

BATCH_FILE, NON_TENSOR_FILE = "verl/batch.parquet", "verl/non_tensor.parquet"

GROUP_BYTES = 256 << 20
"""About this many bytes of padded arrays per row group of ``batch.parquet``: a row of long
sessions (widths near 65,536 + 32,768) takes ~4 MB, so a 512-row batch built whole took ~2 GB
of arrays (and as much again to encode them); a row group of ~64 rows keeps the export's
arrays at one group's, whatever the batch's size."""


def _widths(rows: pl.DataFrame, layout: VerlLayout) -> tuple[int, int]:
    """The layout's widths, else the rows' longest (at least 1: Arrow has no empty array)."""
    width_p = layout.prompt_length or int(lengths(rows["prompt_token_ids"]).max(initial=1))
    width_r = layout.response_length or int(lengths(rows["response_token_ids"]).max(initial=1))
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


@dataclass(frozen=True)
class TensorShape:
    """What every row of a batch's tensors shares: the widths, the pad id and the optional
    tensors, each present only when every row of the batch has its values."""

    width_p: int
    width_r: int
    pad_id: int
    logprobs: bool
    advantages: bool

    @classmethod
    def of(cls, rows: pl.DataFrame, layout: VerlLayout) -> TensorShape:
        """The shape of ``rows``, a whole batch ``fitted`` to ``layout``."""
        width_p, width_r = _widths(rows, layout)
        advantage = rows.get_column("advantage", default=None)
        return cls(
            width_p=width_p,
            width_r=width_r,
            pad_id=layout.pad_token_id,
            logprobs=rows["response_logprobs"].null_count() == 0,
            advantages=advantage is not None and advantage.null_count() == 0 and rows.height > 0,
        )

    def columns(self) -> dict[str, tuple[int, type[np.generic]]]:
        """Each tensor's (width, dtype), in file order."""
        both = self.width_p + self.width_r
        columns = {
            "prompts": (self.width_p, np.int64),
            "responses": (self.width_r, np.int64),
            "input_ids": (both, np.int64),
            "attention_mask": (both, np.int64),
            "position_ids": (both, np.int64),
            "response_mask": (self.width_r, np.int64),
            "rm_scores": (self.width_r, np.float32),
            "token_level_scores": (self.width_r, np.float32),
        }
        if self.logprobs:
            columns["rollout_log_probs"] = (self.width_r, np.float32)
        if self.advantages:
            columns["advantages"] = columns["returns"] = (self.width_r, np.float32)
        return columns

    def group_rows(self) -> int:
        """Rows per row group of ``batch.parquet``, so one group's arrays take about
        ``GROUP_BYTES``."""
        row = sum(width * np.dtype(dtype).itemsize for width, dtype in self.columns().values())
        return max(1, GROUP_BYTES // max(row, 1))


def _tensors(rows: pl.DataFrame, shape: TensorShape) -> dict[str, np.ndarray]:
    """The tensors of ``rows``, fitted to ``shape``'s widths."""
    width_p, width_r = shape.width_p, shape.width_r
    prompt_len, response_len = (
        lengths(rows["prompt_token_ids"]),
        lengths(rows["response_token_ids"]),
    )
    prompt_ids = pad(rows["prompt_token_ids"], width_p, shape.pad_id, np.int64, left=True)
    response_ids = pad(rows["response_token_ids"], width_r, shape.pad_id, np.int64, left=False)
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
    if shape.logprobs:
        logprobs = rows["response_logprobs"]
        tensors["rollout_log_probs"] = pad(logprobs, width_r, 0.0, np.float32, left=False)
    if shape.advantages:
        advantage = rows["advantage"].to_numpy().astype(np.float32)[:, None] * response_mask
        tensors["advantages"] = advantage.astype(np.float32)
        tensors["returns"] = tensors["advantages"].copy()
    return tensors


def verl_tensors(rows: pl.DataFrame, layout: VerlLayout | None = None) -> dict[str, np.ndarray]:
    """The DataProto ``batch`` tensors of ``rows`` (``BATCH_ROWS`` or ``SEQUENCE_ROWS``),
    without padding rows."""
    layout = layout or VerlLayout()
    rows = fitted(rows, layout)
    return _tensors(rows, TensorShape.of(rows, layout))


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


def _padding_rows(count: int, like: pl.DataFrame, pad_id: int) -> pl.DataFrame:
    """``count`` rows that carry no loss, in ``like``'s tensor columns: one attended pad token
    as the prompt (never an empty sequence) and no response."""
    values = {
        "prompt_token_ids": [[pad_id]],
        "response_token_ids": [[]],
        "response_mask": [[]],
        "response_logprobs": [[]],
        "reward": [None],
        "advantage": [0.0],
    }
    one = pl.DataFrame({name: values[name] for name in like.columns}, schema=like.schema)
    return pl.concat([one] * count)


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


def _tensor_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """The columns of ``rows`` the tensors are made of."""
    return rows.select(c for c in TENSOR_SOURCES if c in rows.columns)


def _with_padding(
    sources: pl.DataFrame, non_tensors: pl.DataFrame, layout: VerlLayout
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``sources`` (``_tensor_rows``) and ``non_tensors`` with the padding rows that make
    their row count a multiple of ``layout.pad_to_multiple``, last."""
    extra = -sources.height % layout.pad_to_multiple
    if not extra:
        return sources, non_tensors
    return (
        pl.concat([sources, _padding_rows(extra, sources, layout.pad_token_id)]),
        pl.concat([non_tensors, _padding_non_tensors(extra)], how="diagonal_relaxed"),
    )


def padded(
    rows: pl.DataFrame, layout: VerlLayout | None = None
) -> tuple[dict[str, np.ndarray], pl.DataFrame]:
    """The tensors and the non-tensor frame of ``rows``, padded to ``layout.pad_to_multiple``
    rows with rows that carry no loss."""
    layout = layout or VerlLayout()
    rows = fitted(rows, layout)  # once: the tensors and the non-tensors take the rows as cut
    shape = TensorShape.of(rows, layout)
    non_tensors = verl_non_tensors(rows, layout)
    sources, non_tensors = _with_padding(_tensor_rows(rows), non_tensors, layout)
    return _tensors(sources, shape), non_tensors


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
    """Write ``verl/batch.parquet`` and ``verl/non_tensor.parquet`` of the batch ``rows``
    (padded as ``padded``); (path, description, rows) of each."""
    with VerlFiles(out, layout) as files:
        files.write(rows)
        return files.finish()


class VerlFiles:
    """A batch's verl files, written at ``finish``. Which optional tensors a batch has, and its
    widths (its longest rows, once fitted to the layout's), depend on all its rows, so each
    chunk is fitted and kept as the columns its tensors are made of (its token lists) with its
    non-tensors; ``finish`` pads them a row group at a time (``TensorShape.group_rows``)
    through one Parquet writer, padding rows last, so the padded arrays in memory are one row
    group's, not the batch's."""

    def __init__(self, out: Destination, layout: VerlLayout | None) -> None:
        self.out, self.layout = out, layout or VerlLayout()
        self._sources: list[pl.DataFrame] = []
        self._non_tensors: list[pl.DataFrame] = []

    def write(self, rows: pl.DataFrame) -> None:
        rows = fitted(rows, self.layout)  # a chunk fits alone: widths are fixed or its longest
        self._non_tensors.append(verl_non_tensors(rows, self.layout))
        self._sources.append(_tensor_rows(rows))

    def finish(self) -> list[tuple[str, str, int]]:
        sources, self._sources = pl.concat(self._sources), []
        non_tensors = pl.concat(self._non_tensors, how="diagonal_relaxed")
        self._non_tensors = []
        own_widths = self.layout.model_copy(update={"prompt_length": None, "response_length": None})
        shape = TensorShape.of(sources, own_widths)
        sources, non_tensors = _with_padding(sources, non_tensors, self.layout)
        columns = shape.columns()
        schema = pa.schema(
            (name, pa.list_(pa.from_numpy_dtype(dtype), width))
            for name, (width, dtype) in columns.items()
        )
        step = shape.group_rows()
        with self.out.parquet_writer(BATCH_FILE, schema) as writer:
            for start in range(0, sources.height, step):
                tensors = _tensors(sources.slice(start, step), shape)
                writer.write_table(
                    pa.table([_fixed_lists(tensors[name]) for name in columns], schema=schema)
                )
        self.out.parquet(non_tensors, NON_TENSOR_FILE)
        return [
            (
                BATCH_FILE,
                f"DataProto tensors: {', '.join(sorted(columns))}; widths {shape.width_p} + "
                f"{shape.width_r} (the batch's; Batch.to_verl pads to the recipe's)",
                non_tensors.height,
            ),
            (
                NON_TENSOR_FILE,
                "DataProto non_tensor_batch (uid = group_id), row-aligned",
                non_tensors.height,
            ),
        ]

    def __enter__(self) -> VerlFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sources, self._non_tensors = [], []


def _fixed_lists(array: np.ndarray) -> pa.FixedSizeListArray:
    """A [rows, width] numeric array as Arrow fixed-size lists, sharing its memory (built on
    its buffer: ``pa.array`` of an ndarray imports pandas, 0.3 s of a refresh run's CPU)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    values = pa.Array.from_buffers(
        pa.from_numpy_dtype(flat.dtype), flat.size, [None, pa.py_buffer(flat)]
    )
    return pa.FixedSizeListArray.from_arrays(values, array.shape[1])
