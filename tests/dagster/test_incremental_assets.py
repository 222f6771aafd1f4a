"""The incremental assets come from one factory (``assets.incremental``): each reads exactly
the tables its lineage shows, and takes its run config as a hand-written asset would."""

from __future__ import annotations

import dagster as dg
from dagster_harness import CHAIN, Driver
from dagster_rollouts import land_rollouts


def test_each_incremental_asset_reads_exactly_the_tables_it_depends_on(
    driver: Driver, bound
) -> None:
    """The inputs a run's ``Increment`` pinned (``read_versions``) are the asset's deps."""
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1)
    metadata = driver.refresh()
    graph = bound.defs.resolve_asset_graph()
    for key in CHAIN:
        deps = {parent.to_user_string() for parent in graph.get(dg.AssetKey(key)).parent_keys}
        assert set(metadata[key]["read_versions"]) == deps, key
        assert metadata[key]["rows_written"] > 0, key


def test_the_steps_config_reaches_the_extraction(driver: Driver, bound) -> None:
    """Open trajectories stay open under the default idle timeout and close under a zero one
    given as run config (``ops.steps.config``, as in the launchpad)."""
    land_rollouts(bound.lake, groups=1, group_size=2, steps=1, complete=False)
    job = bound.defs.resolve_implicit_job_def_def_for_assets([dg.AssetKey("steps")])

    def open_turns(config: dict) -> int:
        result = job.execute_in_process(
            instance=driver.instance,
            asset_selection=[dg.AssetKey("steps")],
            run_config={"ops": {"steps": {"config": config}}},
        )
        (event,) = result.asset_materializations_for_node("steps")
        return event.metadata["open_turns"].value

    assert open_turns({}) == 2
    assert open_turns({"idle_timeout_s": 0.0}) == 0
