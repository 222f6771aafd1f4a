"""Fixtures of the Dagster tests: a temporary lake bound to the code location, and one shared
``dagster dev`` (webserver + daemon) for the live and browser tests."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import httpx
import pytest
from dagster_harness import Bound, Driver
from dagster_rollouts import land_rollouts

from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port, start_service
from resources.lake import LakeResource

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).parent / "dagster")


@pytest.fixture
def bound(tmp_path: Path) -> Bound:
    resource = LakeResource(lake_uri=str(tmp_path / "lake"))
    return Bound.over(resource)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as test_instance:
        yield test_instance


@pytest.fixture
def driver(bound: Bound, instance: dg.DagsterInstance) -> Driver:
    return Driver(bound, instance)


DEADLINE_S = 300.0
"""Give up on something the live server should do (and show its log) after this long."""

BATCH_MATERIALIZATIONS = """
query Batches {
  assetOrError(assetKey: {path: ["batch_grpo"]}) {
    ... on Asset {
      assetMaterializations(limit: 20) { partition runId metadataEntries { label } }
    }
  }
}
"""


@dataclass
class DagsterDev:
    service: Service
    port: int
    lake: Lake

    @property
    def url(self) -> str:
        return self.service.url

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        response = httpx.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables or {}}, timeout=30
        )
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return body["data"]

    def wait_for(self, predicate, what: str):
        """Poll ``predicate`` until it returns something truthy; fail with the server log."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            time.sleep(1.0)
        raise AssertionError(f"{what} did not happen:\n{self.service.log_tail(6000)}")

    def batch_materializations(self) -> list[dict]:
        asset = self.graphql(BATCH_MATERIALIZATIONS)["assetOrError"]
        return asset.get("assetMaterializations") or []


@pytest.fixture(scope="session")
def dagster_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    """``dagster dev -w workspace.yaml`` on a free loopback port, a temp home and a temp lake."""
    root = tmp_path_factory.mktemp("dagster_dev")
    home = root / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    lake = Lake(str(root / "lake"))
    port = free_port()
    service = start_service(
        "dagster",
        [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        f"http://127.0.0.1:{port}",
        root / "dagster.log",
        env={
            "DAGSTER_HOME": str(home),
            "CLAW_LAKE_URI": lake.root,
            "CLAW_DAGSTER_SENSOR_INTERVAL_S": "2",
        },
        cwd=REPO,
    )
    try:
        service.wait_ready("/server_info", timeout_s=180)
        yield DagsterDev(service, port, lake)
    finally:
        service.stop(grace_s=15)


@pytest.fixture(scope="session")
def first_batch(dagster_dev: DagsterDev) -> dict:
    """Land four complete GRPO groups and wait until the sensors turned them into a batch."""
    land_rollouts(dagster_dev.lake, groups=4, group_size=4, steps=2, seed=11)
    materializations = dagster_dev.wait_for(
        dagster_dev.batch_materializations, "a batch_grpo materialization"
    )
    return materializations[-1]
