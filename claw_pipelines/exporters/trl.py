"""TRL datasets for a batch (column conventions of TRL's dataset_formats).

- grpo / rloo / ppo / reinforce_pp: ``trl/prompts.parquet`` (prompt-only: ``prompt`` messages
  plus ``ground_truth``, ``data_source`` for reward functions; one row per group, the state the
  group was sampled from) and ``trl/rollouts.parquet`` (the ``rollout_func`` payload:
  ``prompt_ids``, ``completion_ids``, ``logprobs``, ``reward`` per step).
- dpo: ``trl/preference.parquet`` with ``prompt``, ``chosen``, ``rejected`` (message lists).
- sft: ``trl/sft_messages.parquet`` (one row per trajectory: ``messages`` = its last step's
  request + reply, the whole conversation, so SFTTrainer trains each assistant turn once rather
  than once per later step whose history repeats it) and ``trl/sft_tokens.parquet``
  (pre-tokenized, one row per step: ``input_ids`` + ``completion_mask`` on that step's response).

Each conversational dataset has ``tools``: the tools the request declared (the OpenAI ``tools``
list as JSON text, null when none), which TRL's trainers hand to ``apply_chat_template`` (they
``json.loads`` a string, the form every ``datasets`` version reads), so the prompt is rendered
as the policy saw it; GRPO/RLOO pass it, like every extra column, to reward functions and the
``rollout_func``.
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.exporters.chat import messages, reply
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.transforms.messages import claw_field


def _ones_like(column: str, value: int) -> pl.Expr:
    return pl.col(column).fill_null([]).list.eval(pl.element() * 0 + value).cast(pl.List(pl.Int8))


def trl_frames(algorithm: str, rows: pl.DataFrame) -> dict[str, tuple[pl.DataFrame, str]]:
    """File name (under trl/) -> (dataset frame, description)."""
    if algorithm == "dpo":
        preference = rows.select(
            messages("request_messages").alias("prompt"),
            reply("chosen_message").alias("chosen"),
            reply("rejected_message").alias("rejected"),
            pl.col("request_tools").alias("tools"),
            "group_id",
            "turn_id",
            "rejected_turn_id",
        )
        return {"preference.parquet": (preference, "DPOTrainer: prompt, chosen, rejected")}
    if algorithm == "sft":
        chat = (
            rows.sort("trajectory_id", "step_index")
            .group_by("trajectory_id", maintain_order=True)
            .last()
            .select(
                pl.concat_list(messages("request_messages"), reply("response_message")).alias(
                    "messages"
                ),
                pl.col("request_tools").alias("tools"),
                "trajectory_id",
                pl.col("step_index").alias("last_step_index"),
            )
        )
        tokens = rows.select(
            pl.concat_list("prompt_token_ids", "response_token_ids").alias("input_ids"),
            pl.concat_list(_ones_like("prompt_token_ids", 0), _ones_like("response_token_ids", 1))
            .alias("completion_mask"),
            "trajectory_id",
            "step_index",
        )  # fmt: skip
        return {
            "sft_messages.parquet": (chat, "SFTTrainer conversational: messages per trajectory"),
            "sft_tokens.parquet": (tokens, "SFTTrainer pre-tokenized: input_ids, completion_mask"),
        }
    prompts = (
        rows.sort("group_id", "trajectory_id", "step_index")
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
    rollouts = rows.select(
        pl.col("prompt_token_ids").alias("prompt_ids"),
        pl.col("response_token_ids").alias("completion_ids"),
        pl.col("response_logprobs").alias("logprobs"),
        "reward",
        "group_id",
        "trajectory_id",
        "step_index",
        "is_last",
    )
    return {
        "prompts.parquet": (prompts, "GRPOTrainer/RLOOTrainer prompts: prompt + ground truth"),
        "rollouts.parquet": (
            rollouts,
            "rollout_func payload: prompt_ids, completion_ids, logprobs",
        ),
    }


def write_trl(algorithm: str, rows: pl.DataFrame, out: Destination) -> list[tuple[str, str, int]]:
    written = []
    for name, (frame, description) in trl_frames(algorithm, rows).items():
        out.parquet(frame, f"trl/{name}")
        written.append((f"trl/{name}", description, frame.height))
    return written
