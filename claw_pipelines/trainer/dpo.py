"""TRL's DPOTrainer on a batch's engine token IDs (``Batch.to_trl("preference_tokens")``).

Stock ``DPOTrainer`` (trl 1.16) runs ``_prepare_dataset`` on every text dataset: it extracts a
prompt from ``chosen`` / ``rejected`` when there is no ``prompt`` column (``KeyError: 'chosen'``
on a token dataset), appends EOS and tokenizes the text again. No ``DPOConfig`` field skips it
(only a vision dataset does), and text tokenized again is not the IDs the engine sampled. This
subclass takes a dataset that already holds ``prompt_ids``, ``chosen_ids`` and ``rejected_ids``
(what ``_prepare_dataset`` would produce and ``DataCollatorForPreference`` reads) as it is, and
leaves any other dataset to the stock preparation.

Needs ``trl`` (this module is not imported by ``claw_pipelines.trainer``).
"""

from __future__ import annotations

from typing import Any

from trl import DPOTrainer

PREFERENCE_TOKENS = frozenset({"prompt_ids", "chosen_ids", "rejected_ids"})
"""The columns of a pre-tokenized preference dataset."""


class TokenDPOTrainer(DPOTrainer):
    """``DPOTrainer`` that trains on the dataset's token IDs when it has them."""

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str):
        if not PREFERENCE_TOKENS.issubset(next(iter(dataset))):
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        if args.max_length is not None and args.truncation_mode == "keep_start":
            # as the stock preparation does: a prompt that fills max_length leaves no completion
            return dataset.filter(lambda example: len(example["prompt_ids"]) < args.max_length)
        return dataset
