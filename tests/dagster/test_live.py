"""A real ``dagster dev`` (webserver + daemon): turns land, a batch and its export appear with no
one clicking, and a materialization launched over GraphQL succeeds."""

from __future__ import annotations

import json
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError


def test_new_turns_become_a_batch_without_clicking(dagster_dev, first_batch) -> None:
    assert first_batch["partition"] == "grpo-000001"
    labels = {entry["label"] for entry in first_batch["metadataEntries"]}
    assert {"dagster/partition_row_count", "pinned_versions", "sample"} <= labels
    rows = dagster_dev.lake.scan("batches/grpo").collect()
    assert rows.height == 32 and rows.get_column("group_id").n_unique() == 4
    ledger = dagster_dev.lake.scan("batch_ledger/grpo").collect()
    assert ledger.get_column("turn_id").n_unique() == ledger.height == 32
    manifest = Path(dagster_dev.lake.uri("exports/grpo/grpo-000001")) / "manifest.json"
    dagster_dev.wait_for(manifest.exists, "the first batch's export")
    assert json.loads(manifest.read_text())["rows"] == 16  # a sequence per two-step trajectory


def test_launch_over_graphql_reproduces_a_batch(dagster_dev, first_batch) -> None:
    before = dagster_dev.lake.scan("batches/grpo").sort("turn_id").collect()
    client = DagsterGraphQLClient("127.0.0.1", port_number=dagster_dev.port)
    run_id = client.submit_job_execution(
        "__ASSET_JOB",
        repository_location_name="claw_pipelines",
        asset_selection=[["batch_grpo"]],
        tags={"dagster/partition": first_batch["partition"]},
    )

    def finished() -> str | None:
        try:
            status = client.get_run_status(run_id).value
        except DagsterGraphQLClientError:
            return None
        return status if status in {"SUCCESS", "FAILURE", "CANCELED"} else None

    assert dagster_dev.wait_for(finished, f"run {run_id}") == "SUCCESS"
    after = dagster_dev.lake.scan("batches/grpo").sort("turn_id").collect()
    assert after.columns == before.columns
    assert after.equals(before), "the re-materialized batch differs in some column"
