"""TRL datasets for a batch (column conventions of TRL's dataset_formats).

- grpo / rloo / ppo / reinforce_pp: ``trl/prompts.parquet`` (prompt-only: ``prompt`` messages
  plus ``ground_truth``, ``data_source`` for reward functions; one row per group, the state the
  group was sampled from) and ``trl/rollouts.parquet`` (the ``rollout_func`` payload:
  ``prompt_ids``, ``completion_ids``, ``logprobs``, ``reward``; in the sequence layout one row
  per segment, ``completion_ids`` its replies and observations, ``env_mask`` (the completion
  mask ``rollout_func`` may return: 1 on the policy's tokens, 0 on observations), logprobs 0.0
  on observations and ``spans`` (each step's reply and reward); in the step layout one per
  step).
- dpo: ``trl/preference.parquet`` with ``prompt``, ``chosen``, ``rejected`` (message lists) and
  ``trl/preference_tokens.parquet`` (``prompt_ids``, ``chosen_ids``, ``rejected_ids``: the
  engine's IDs, what TRL's preference collator takes; ``trainer.dpo.TokenDPOTrainer`` trains
  on them, as stock ``DPOTrainer`` tokenizes every text dataset again).
- sft: ``trl/sft_messages.parquet`` (one row per trajectory: ``messages`` = its last step's
  request + reply, the whole conversation, so SFTTrainer trains each assistant turn once rather
  than once per later step whose history repeats it) and ``trl/sft_tokens.parquet``
  (pre-tokenized: ``input_ids`` + ``completion_mask``; one row per segment, the mask on its
  replies, in the sequence layout; one per step, the mask on its response, in the step layout).

Token datasets carry ``tokenizer``: the model whose tokenizer made the IDs.

A reply cut off at max_tokens (``finish_reason`` length) has no end-of-turn token, but a chat
template closes every assistant message it renders: conversational files leave out the pairs
and trajectories with such a reply (they stay in the token files, which hold the engine's IDs as
they were), and every file carries the finish reasons.

Each conversational dataset has ``tools``: the tools the request declared (the OpenAI ``tools``
list as JSON text, null when none), which TRL's trainers hand to ``apply_chat_template`` (they
``json.loads`` a string, the form every ``datasets`` version reads), so the prompt is rendered
as the policy saw it; GRPO/RLOO pass it, like every extra column, to reward functions and the
``rollout_func``.
"""

from __future__ import annotations

from functools import partial

import polars as pl
import pyarrow as pa

from claw_pipelines.exporters.chat import json_arguments, messages, reply
from claw_pipelines.exporters.chunked_files import ChunkedFiles
from claw_pipelines.exporters.destination import Destination, row_group_rows
from claw_pipelines.transforms.messages import claw_field
from claw_pipelines.transforms.sequences import is_sequence

TRUNCATED = "length"
"""The finish reason of a reply cut off at max_tokens."""


def _ended(*columns: str) -> pl.Expr:
    """No reply in ``columns`` was cut off."""
    return pl.all_horizontal(pl.col(c).fill_null("") != TRUNCATED for c in columns)


def _ones_like(column: str, value: int) -> pl.Expr:
    return pl.col(column).fill_null([]).list.eval(pl.element() * 0 + value).cast(pl.List(pl.Int8))


def trl_frames(algorithm: str, rows: pl.DataFrame) -> dict[str, tuple[pl.DataFrame, str]]:
    """File name (under trl/) -> (dataset frame, description)."""
    if algorithm == "dpo":
        reasons = ["chosen_finish_reason", "rejected_finish_reason"]
        ids = ["group_id", "turn_id", "rejected_turn_id", *reasons]
        preference = rows.filter(_ended(*reasons)).select(
            messages("request_messages").alias("prompt"),
            reply("chosen_message").alias("chosen"),
            reply("rejected_message").alias("rejected"),
            pl.col("request_tools").alias("tools"),
            *ids,
        )
        tokens = rows.select(
            pl.col("prompt_token_ids").alias("prompt_ids"),
            pl.col("chosen_token_ids").alias("chosen_ids"),
            pl.col("rejected_token_ids").alias("rejected_ids"),
            *ids,
            pl.col("model").alias("tokenizer"),
        )
        return {
            "preference.parquet": (preference, "DPOTrainer: prompt, chosen, rejected"),
            "preference_tokens.parquet": (tokens, "pairs as engine IDs, truncated ones too"),
        }
    sequence = is_sequence(rows)
    order, last_step = ("segment_index", "last_step_index") if sequence else ("step_index",) * 2
    if algorithm == "sft":
        ended = _ended("finish_reason").all().over("trajectory_id")
        chat = (
            rows.sort("trajectory_id", order)
            .filter(ended)
            .group_by("trajectory_id", maintain_order=True)
            .last()
            .select(
                pl.concat_list(messages("request_messages"), reply("response_message")).alias(
                    "messages"
                ),
                pl.col("request_tools").alias("tools"),
                "trajectory_id",
                pl.col(last_step).alias("last_step_index"),
                "finish_reason",
            )
        )
        completion = pl.col("response_mask") if sequence else _ones_like("response_token_ids", 1)
        tokens = rows.select(
            pl.concat_list("prompt_token_ids", "response_token_ids").alias("input_ids"),
            pl.concat_list(_ones_like("prompt_token_ids", 0), completion)
            .alias("completion_mask"),
            "trajectory_id",
            order,
            "finish_reason",
            pl.col("model").alias("tokenizer"),
        )  # fmt: skip
        return {
            "sft_messages.parquet": (chat, "SFTTrainer conversational: messages per trajectory"),
            "sft_tokens.parquet": (tokens, "SFTTrainer pre-tokenized: input_ids, completion_mask"),
        }
    first_request = "prompt_messages" if sequence else "request_messages"
    prompts = (
        rows.select(
            "group_id",
            "trajectory_id",
            order,
            pl.col(first_request).alias("request_messages"),
            "request_tools",
            "metadata",
        )
        .sort("group_id", "trajectory_id", order)
        .group_by("group_id", maintain_order=True)
        .first()
        .select(
            messages("request_messages").alias("prompt"),
            pl.col("request_tools").alias("tools"),
            claw_field("ground_truth").alias("ground_truth"),
            claw_field("data_source").alias("data_source"),
            "group_id",
        )
    )
    per_sequence = [pl.col("response_mask").alias("env_mask"), "spans"] if sequence else []
    rollouts = rows.select(
        pl.col("prompt_token_ids").alias("prompt_ids"),
        pl.col("response_token_ids").alias("completion_ids"),
        *per_sequence,
        pl.col("response_logprobs").alias("logprobs"),
        "reward",
        "group_id",
        "trajectory_id",
        order,
        "is_last",
        "finish_reason",
        pl.col("model").alias("tokenizer"),
    )
    return {
        "prompts.parquet": (prompts, "GRPOTrainer/RLOOTrainer prompts: prompt + ground truth"),
        "rollouts.parquet": (
            rollouts,
            "rollout_func payload: prompt_ids, completion_ids, logprobs",
        ),
    }


def trl_tables(algorithm: str, rows: pl.DataFrame) -> dict[str, tuple[pa.Table, str]]:
    """``trl_frames`` as Arrow tables, tool-call arguments typed as JSON objects."""
    return {
        name: (json_arguments(frame.to_arrow()), description)
        for name, (frame, description) in trl_frames(algorithm, rows).items()
    }


class TrlFiles(ChunkedFiles):
    """A batch's TRL files, written a chunk of rows at a time (each chunk holds whole groups
    and trajectories, in export order)."""

    def __init__(self, algorithm: str, out: Destination) -> None:
        super().__init__()
        self.algorithm, self.out = algorithm, out

    def write(self, rows: pl.DataFrame) -> None:
        for name, (table, description) in trl_tables(self.algorithm, rows).items():
            path = f"trl/{name}"
            file = self._opened(
                path, description, partial(self.out.parquet_writer, path, table.schema)
            )
            if table.num_rows:
                file.handle.write_table(table, row_group_size=row_group_rows(table))
            file.rows += table.num_rows
