"""Materialization metadata that renders well in the Dagster UI (markdown, not polars reprs).

Dagster keeps it in its run storage, outside the lake: a sample's cells are scrubbed as capture
scrubs rows (rows landed before a credential shape was known may still hold one), before they
are cut to length, so no part of a credential is kept either."""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from claw_pipelines.derived_schemas import with_turn_columns
from claw_pipelines.incremental.increment import SAMPLE_ROWS, Increment
from claw_pipelines.redaction import Redactor

CELL_CHARS = 80
_REDACTOR = Redactor.from_environment()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, list):
        text = f"[{len(value)} items]"
    else:
        text = str(value)
    text = _REDACTOR.text(" ".join(text.split())).replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def markdown_table(frame: pl.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows])


def sample(
    frame: pl.DataFrame | None, columns: list[str], turns: pl.LazyFrame | None = None
) -> dg.MetadataValue:
    """A few rows with the decoded text, so a reviewer sees what the tokens say. Step rows
    point at their turns for their reply: given ``turns``, the sampled rows' ``response_text``
    is read from there."""
    if frame is None or frame.is_empty():
        return dg.MetadataValue.md("_no new rows_")
    rows = frame.head(SAMPLE_ROWS)
    if turns is not None:
        rows = with_turn_columns(rows, turns, ["response_text"])
    present = [c for c in columns if c in rows.columns]
    return dg.MetadataValue.md(markdown_table(rows.select(present)))


def histogram(values: pl.Series, bins: int = 10) -> dg.MetadataValue:
    """A markdown bar histogram of a numeric column (nulls counted apart)."""
    present = values.drop_nulls().cast(pl.Float64)
    nulls = values.len() - present.len()
    if present.is_empty():
        return dg.MetadataValue.md(f"_no values_ ({nulls} null)")
    low, high = present.min(), present.max()
    if low == high:
        lines = [f"`{low:.3g}` {'█' * 20} {present.len()}"]
    else:
        width = (high - low) / bins
        index = ((present - low) / width).floor().clip(0, bins - 1).cast(pl.Int64)
        counts = index.value_counts().sort(index.name)
        by_bin = dict(zip(counts[index.name].to_list(), counts["count"].to_list(), strict=True))
        peak = max(by_bin.values())
        lines = []
        for b in range(bins):
            count = by_bin.get(b, 0)
            bar = "█" * round(20 * count / peak)
            close = "]" if b == bins - 1 else ")"
            span = f"[{low + b * width:.3g}, {low + (b + 1) * width:.3g}{close}"
            lines.append(f"`{span}` {bar} {count}")
    lines.append(f"null: {nulls}")
    return dg.MetadataValue.md("  \n".join(lines))


def declared_columns(schema: pa.Schema) -> dict[str, dg.TableSchema]:
    """An asset's definition metadata: the columns its table is declared with, shown in the UI
    before its first run. Materializations do not repeat them (each copy was ~8.5 kB of every
    run's events); the ``schema_unchanged`` check says whether the table still matches."""
    columns = [dg.TableColumn(name=f.name, type=str(f.type)) for f in schema]
    return {"dagster/column_schema": dg.TableSchema(columns=columns)}


def table_metadata(table: DeltaTable, uri: str) -> dict[str, Any]:
    """Row count of a whole Delta table, from the log alone (no data files read)."""
    actions = pl.DataFrame(table.get_add_actions(flatten=True))
    rows = int(actions["num_records"].sum()) if actions.height else 0
    return {
        "dagster/row_count": rows,
        "dagster/uri": dg.MetadataValue.path(uri),
        "delta_version": table.version(),
    }


def counts(frame: pl.DataFrame, column: str) -> dict[str, int]:
    return {str(k): n for k, n in frame.group_by(column).len().sort(column).iter_rows()}


def written_metadata(increment: Increment, table: DeltaTable, rows_written: int) -> dict[str, Any]:
    """Whole-table facts plus what this run read (version range per input) and wrote."""
    return {
        **table_metadata(table, increment.lake.uri(increment.output)),
        "read_versions": dg.MetadataValue.json(increment.ranges()),
        "rows_read": dg.MetadataValue.json(increment.rows_read),
        "rows_written": rows_written,
    }
