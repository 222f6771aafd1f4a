"""The Dagster side of one batch, shared by the partitioned batch and export assets and by the
release asset: partitions, keys, pools and check specs, and the mapping of the library's
results (``batching.release``) to Dagster's metadata and check results, and of its
``BatchRefused`` to ``dg.Failure``."""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import polars as pl

from assets.metadata import histogram, markdown_table
from claw_pipelines.batching.checks import CHECKS, CheckOutcome
from claw_pipelines.batching.release import BatchRefused, BuiltBatch, ExportedBatch


def partitions(recipe: str) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"batches_{recipe}")


def batch_key(recipe: str) -> dg.AssetKey:
    """The partitioned batch asset of ``recipe``, which the release asset also records."""
    return dg.AssetKey(f"batch_{recipe}")


def export_key(recipe: str) -> dg.AssetKey:
    return dg.AssetKey(f"export_{recipe}")


def batch_pool(recipe: str) -> str:
    """The pool of ``recipe``'s batch and release steps: they share it, so a release never
    races a UI launch of the same recipe (dagster.yaml: one slot per pool)."""
    return f"claw_batch_{recipe}"


def batch_checks(recipe: str, parts: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    """Blocking checks kept per batch partition: each batch's result gates its own export.
    Checks kept per asset gate every partition on the latest evaluation, which need not be of
    the latest batch when batches run at once, and an export could then wait forever.
    Partitioned checks are a Dagster preview feature; the lock pins Dagster's exact version,
    so its preview warning is silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(check, asset=batch_key(recipe), blocking=True, partitions_def=parts)
            for check in CHECKS
        ]


@contextmanager
def refused_as_failure() -> Iterator[None]:
    """A batch breaking an invariant fails its step for good: a retry would break it again."""
    try:
        yield
    except BatchRefused as refused:
        raise dg.Failure(str(refused), allow_retries=False) from refused


def _value(value: Any) -> Any:
    return dg.MetadataValue.json(value) if isinstance(value, list | dict) else value


def check_result(outcome: CheckOutcome) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=outcome.name,
        passed=outcome.passed,
        metadata={key: _value(value) for key, value in outcome.facts.items()},
    )


def built_metadata(built: BuiltBatch) -> dict[str, Any]:
    """What a batch partition's materialization records."""
    return {
        "dagster/row_count": built.table_rows,
        "dagster/uri": dg.MetadataValue.path(built.table_uri),
        "delta_version": built.table_version,
        "dagster/partition_row_count": built.rows,
        "batch_id": built.batch_id,
        "pinned_versions": dg.MetadataValue.json(built.pins.model_dump(mode="json")),
        "groups": built.groups,
        "trajectories": built.trajectories,
        "sample": dg.MetadataValue.md(markdown_table(pl.DataFrame(built.sample))),
        "reward_distribution": histogram(pl.Series(built.rewards, dtype=pl.Float64)),
        "dropped": dg.MetadataValue.json(built.dropped),
        "retired": dg.MetadataValue.json(built.retired),
        "retired_before": built.retired_before,
    }


def export_metadata(exported: ExportedBatch) -> dict[str, Any]:
    """What an export partition's materialization records."""
    files = pl.DataFrame([f.model_dump() for f in exported.manifest.files])
    return {
        "dagster/uri": dg.MetadataValue.path(exported.uri),
        "dagster/partition_row_count": exported.manifest.rows,
        "files": dg.MetadataValue.md(markdown_table(files)),
        "manifest": dg.MetadataValue.json(exported.manifest.model_dump(mode="json")),
    }


def log_recipe_edited(log: Any, built: BuiltBatch) -> None:
    if built.recipe_edited:
        log.info(
            "%s is re-planned under the recipe it was planned with; the edits to "
            "assets/batches.yaml apply to new batches",
            built.batch_id,
        )
