"""Write a batch under a directory in the recipe's export formats, described by its manifest
(``batches.manifest``), written last."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from functools import partial

import polars as pl

from claw_pipelines.batches.manifest import ExportedFile, Manifest, ModelRows, VerlLayout
from claw_pipelines.batches.names import MANIFEST
from claw_pipelines.batches.pins import Pins
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batches.rows import in_export_order
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.jsonl import JsonlFiles
from claw_pipelines.exporters.trl import TrlFiles
from claw_pipelines.exporters.verl import VerlFiles
from claw_pipelines.transforms.sequences import is_sequence, segment_index, sequences


def verl_layout(recipe: Recipe) -> VerlLayout:
    """The recipe's verl widths (``Recipe.widths``), pad id, truncation rule and row multiple."""
    prompt_length, response_length = recipe.widths
    return VerlLayout(
        prompt_length=prompt_length,
        response_length=response_length,
        pad_token_id=recipe.pad_token_id or 0,
        truncation=recipe.truncation,
        pad_to_multiple=recipe.pad_to_multiple,
    )


def in_layout(recipe: Recipe, rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` in the recipe's layout: complete step rows (``BATCH_ROWS``, with every prompt)
    of a sequence recipe become its ``SEQUENCE_ROWS``."""
    if recipe.layout != "sequence" or is_sequence(rows):
        return rows
    if "segment_index" not in rows.columns or rows.get_column("segment_index").has_nulls():
        rows = rows.with_columns(segment_index())
    return sequences(rows)


def export_batch(
    recipe: Recipe,
    rows: pl.DataFrame,
    out: Destination,
    *,
    source_versions: dict[str, int] | None = None,
    planned_with: Pins | None = None,
) -> Manifest:
    """Write ``rows`` (one batch, put ``in_layout`` and ``in_export_order`` here) for each of
    ``recipe.exports`` under ``out``; return and write ``manifest.json`` (``export_chunks``)."""
    return export_chunks(
        recipe,
        [in_export_order(recipe.algorithm, in_layout(recipe, rows))],
        out,
        source_versions=source_versions,
        planned_with=planned_with,
    )


def export_chunks(
    recipe: Recipe,
    chunks: Iterable[pl.DataFrame],
    out: Destination,
    *,
    source_versions: dict[str, int] | None = None,
    planned_with: Pins | None = None,
) -> Manifest:
    """Write one batch, given as ``chunks`` of its rows in export order (each holding whole
    groups and trajectories; complete step rows are put ``in_layout``), for each of
    ``recipe.exports`` under ``out``, a chunk at a time; return and write ``manifest.json``,
    last. verl needs token rows and is skipped for dpo pairs."""
    dpo = recipe.algorithm == "dpo"
    layout = verl_layout(recipe) if not dpo else None
    formats = {
        "verl": lambda: VerlFiles(out, layout),
        "trl": lambda: TrlFiles(recipe.algorithm, out),
        "jsonl": lambda: JsonlFiles(recipe.algorithm, out),
    }
    wanted = [f for f in formats if f in recipe.exports and not (f == "verl" and dpo)]
    batch_ids: set[str] = set()
    rows, models = 0, Counter()
    with ExitStack() as stack:
        writers = {name: stack.enter_context(formats[name]()) for name in wanted}
        for chunk in map(partial(in_layout, recipe), chunks):
            batch_ids.update(chunk.get_column("batch_id").unique().to_list())
            if len(batch_ids) > 1:
                raise ValueError(f"an export takes the rows of exactly one batch, got {batch_ids}")
            rows += chunk.height
            models.update(dict(chunk.group_by("model").len().iter_rows()))
            for writer in writers.values():
                writer.write(chunk)
        if not batch_ids:
            raise ValueError("an export takes the rows of exactly one batch, got none")
        files = [
            ExportedFile(path=path, format=name, rows=count, description=description)
            for name, writer in writers.items()
            for path, description, count in writer.finish()
        ]
    manifest = Manifest(
        recipe=recipe.name,
        algorithm=recipe.algorithm,
        batch_id=batch_ids.pop(),
        layout=recipe.layout or "step",
        rows=rows,
        source_versions=source_versions or {},
        planned_with=planned_with,
        models=[
            ModelRows(model=m, rows=n)
            for m, n in sorted(models.items(), key=lambda item: (item[0] is not None, item[0]))
        ],
        tokenizer=next(iter(models)) if len(models) == 1 else None,
        verl_layout=layout,
        files=files,
    )
    out.text(manifest.model_dump_json(indent=2), MANIFEST)
    return manifest
