"""One exported batch as a trainer takes it: its rows, its manifest, and the trainers' layouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from claw_pipelines.batches.manifest import Manifest, VerlLayout
from claw_pipelines.batches.names import batches_table, export_folder
from claw_pipelines.batches.rows import batch_rows
from claw_pipelines.exporters.trl import trl_tables
from claw_pipelines.exporters.verl import verl_arrays
from claw_pipelines.lake import Lake

if TYPE_CHECKING:
    import datasets


@dataclass(frozen=True)
class Batch:
    recipe: str
    batch_id: str
    manifest: Manifest
    rows: pl.DataFrame
    """The batch's rows (``batches/<recipe>``, with the token lists and messages of the turns
    they point at; one per segment in the ``sequence`` layout, ``manifest.layout``), in the
    order of every export file."""
    export_uri: str
    """The folder of the batch's export files (``verl/``, ``trl/``, ``jsonl/``, manifest)."""

    @classmethod
    def load(cls, lake: Lake, recipe: str, batch_id: str) -> Batch:
        manifest = Manifest.read(lake, recipe, batch_id)
        rows = batch_rows(lake, recipe, manifest.algorithm, batch_id, manifest.layout)
        if rows.is_empty():
            raise LookupError(f"batch {batch_id} has no rows in {batches_table(recipe)}")
        return cls(
            recipe=recipe,
            batch_id=batch_id,
            manifest=manifest,
            rows=rows,
            export_uri=lake.uri(export_folder(recipe, batch_id)),
        )

    def to_verl(
        self,
        prompt_length: int | None = None,
        response_length: int | None = None,
        pad_token_id: int | None = None,
        pad_to_multiple: int | None = None,
        truncation: str | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(tensors, non_tensors)`` for verl's ``DataProto.from_dict(tensors=...,
        non_tensors=...)``; layout in ``exporters.verl``. Widths, pad id, truncation and row
        multiple default to the recipe's (the manifest's ``verl_layout``: fixed widths, so
        batches concatenate, and rows padded to a multiple, so ``chunk`` divides them);
        ``pad_to_multiple`` (the data-parallel world size) appends rows that carry no loss
        (``is_pad``)."""
        if self.manifest.algorithm == "dpo":
            raise ValueError("verl takes token rows; a dpo batch is pairs (use to_trl)")
        recipe = self.manifest.verl_layout or VerlLayout()
        layout = VerlLayout(
            prompt_length=prompt_length or recipe.prompt_length,
            response_length=response_length or recipe.response_length,
            pad_token_id=recipe.pad_token_id if pad_token_id is None else pad_token_id,
            truncation=truncation or recipe.truncation,
            pad_to_multiple=pad_to_multiple or recipe.pad_to_multiple,
        )
        return verl_arrays(self.rows, layout)

    def trl_kinds(self) -> list[str]:
        """The TRL datasets this batch's algorithm has (``to_trl`` kinds)."""
        return [
            name.removesuffix(".parquet")
            for name in trl_tables(self.manifest.algorithm, self.rows.head(0))
        ]

    def to_trl(self, kind: str) -> datasets.Dataset:
        """The TRL dataset ``kind`` (``trl_kinds``: prompts, rollouts, preference, sft_messages,
        ...) as a ``datasets.Dataset``, tool-call arguments decoded as dicts. Needs the
        ``datasets`` package (>= 4.7; ``pip install claw-pipelines[trl]``).
        ``preference_tokens`` trains in ``trainer.dpo.TokenDPOTrainer`` (stock ``DPOTrainer``
        tokenizes every text dataset again)."""
        try:
            import datasets
        except ImportError as error:
            raise ImportError(
                "Batch.to_trl needs `datasets` (pip install 'datasets>=4.7')"
            ) from error
        tables = trl_tables(self.manifest.algorithm, self.rows)
        if f"{kind}.parquet" not in tables:
            raise ValueError(
                f"{self.manifest.algorithm} batches have TRL kinds {self.trl_kinds()}, not {kind!r}"
            )
        table, _ = tables[f"{kind}.parquet"]
        return datasets.Dataset(datasets.table.InMemoryTable(table))
