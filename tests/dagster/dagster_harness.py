"""Drive the code location in-process the way the daemon would: sensors with cursors, runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from assets.definitions import build_definitions
from claw_pipelines.lake import Lake
from resources.lake import LakeResource

CHAIN = ["steps", "trajectories", "rewarded_steps", "scored_steps", "curated_steps"]


@dataclass
class Bound:
    """A temporary lake and the code location bound to it."""

    lake: Lake
    resource: LakeResource
    defs: dg.Definitions

    @classmethod
    def over(cls, resource: LakeResource) -> Bound:
        return cls(
            resource.lake(),
            resource,
            build_definitions(lake=resource, sensor_interval_s=1, sensor_wait_s=0),
        )

    def sensor(self, name: str) -> dg.SensorDefinition:
        return self.defs.resolve_sensor_def(name)

    def asset(self, key: str) -> dg.AssetsDefinition:
        return self.defs.resolve_assets_def(key)


def retry_reasons(result: dg.ExecuteInProcessResult) -> list[str]:
    """The message of each error a step of the run was retried on."""
    return [
        event.event_specific_data.error.message
        for event in result.all_events
        if event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]


@dataclass
class KilledOnCall:
    """Stands in for ``function`` and raises on its ``n``-th call, as a worker killed mid-run
    would; ``calls`` counts every call."""

    function: Callable[..., Any]
    n: int
    calls: int = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.n:
            raise RuntimeError("worker killed")
        return self.function(*args, **kwargs)


class Driver:
    """Does what the daemon does: ticks sensors (keeping cursors) and runs what they ask for."""

    def __init__(self, bound, instance: dg.DagsterInstance) -> None:
        self.bound = bound
        self.instance = instance
        self.cursors: dict[str, str | None] = {}

    def tick(self, name: str) -> dg.SensorResult | dg.SkipReason:
        context = dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursors.get(name),
            resources={"lake": self.bound.resource},
            definitions=self.bound.defs,
        )
        result = self.bound.sensor(name)(context)
        if isinstance(result, dg.SensorResult):
            self.cursors[name] = result.cursor
            for event in result.asset_events:
                self.instance.report_runless_asset_event(event)
            for request in result.dynamic_partitions_requests:
                self.instance.add_dynamic_partitions(
                    request.partitions_def_name, list(request.partition_keys)
                )
        elif context.cursor != self.cursors.get(name):
            self.cursors[name] = context.cursor
        return result

    def attempt(self, keys: list[str], partition_key: str | None = None):
        """Run ``keys`` (and their checks) in one in-process run, as a launched run would, and
        return its result whether or not it succeeded."""
        selection = [dg.AssetKey(k) for k in keys]
        job = self.bound.defs.resolve_implicit_job_def_def_for_assets(selection)
        return job.execute_in_process(
            instance=self.instance,
            asset_selection=selection,
            partition_key=partition_key,
            raise_on_error=False,
        )

    def materialize(self, keys: list[str], partition_key: str | None = None):
        """``attempt`` that must succeed with every check passing."""
        result = self.attempt(keys, partition_key)
        assert result.success
        failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
        assert not failed, failed
        return result

    def metadata(self, result, key: str) -> dict:
        (event,) = result.asset_materializations_for_node(key)
        return {k: v.value for k, v in event.metadata.items()}

    def refresh(self) -> dict[str, dict]:
        self.tick("landing_ingest_sensor")
        result = self.materialize(CHAIN)
        return {key: self.metadata(result, key) for key in CHAIN}
