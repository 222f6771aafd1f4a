"""The landing tables (written by the capture proxy) and the sensor that notices new commits.

Dagster never writes their rows (only the maintenance pass compacts and vacuums their files), so
they are external assets; the ingest sensor turns each new Delta version that changed data into a
runless materialization, which is what declarative automation on the derived assets reacts to.
It also launches the refresh run itself (steps to curated steps, then the batches they made
ready, in one run): waiting for the automation sensor's next tick and a second run would add
a daemon loop and a run launch to every batch's way to the trainer.
"""

import json

import dagster as dg
from deltalake import DeltaTable

from assets.runs import has_run_before
from claw_pipelines.config_files import recipes
from claw_pipelines.lake.changes import data_commits
from claw_pipelines.schemas import LANDING_MODELS
from resources.lake import LakeResource

OWNERS = ["team:rl-data"]

_DESCRIPTIONS = {
    "turns": "One row per LLM call with the engine's exact token IDs (written by the proxy).",
    "rewards": "Rewards and feedback that arrive after the turn, trajectory or group they score.",
    "trajectory_events": "Trajectory lifecycle events (completed, aborted) with optional outcome.",
    "trajectory_registrations": "What agents declared about a trajectory (Claw-R1's "
    "register_trajectory): channel, ground truth and data source for the rule rewards.",
    "labels": "Human curation decisions (quality label, trainable, tags); latest label wins.",
    "policy_versions": "Policy versions the trainer announced and its weight-sync pauses.",
}

LANDING_TABLES = list(LANDING_MODELS)

REFRESH = ["steps", "trajectories", "rewarded_steps", "scored_steps", "curated_steps",
           *(f"release_{name}" for name in recipes())]  # fmt: skip
"""What new landing data refreshes, in one run (``assets.release`` builds the batches)."""

CLOSING_TABLES = ["trajectory_events", "rewards", "labels"]
"""Landing tables whose new rows can make a batch ready (a completion, a reward, a label): a
waiting tick of the ingest sensor reports them the moment they land."""

LANDING_SPECS = [
    dg.AssetSpec(
        key=table,
        group_name="landing",
        kinds={"deltalake"},
        owners=OWNERS,
        description=_DESCRIPTIONS[table],
        metadata={
            "columns": dg.TableSchema(
                columns=[dg.TableColumn(f.name, str(f.type)) for f in model.arrow_schema()]
            )
        },
    )
    for table, model in LANDING_MODELS.items()
]


def _data_changed(table: DeltaTable, after_version: int | None) -> bool:
    """Whether a commit after ``after_version`` changed data: compaction and vacuum commits do
    not, and reporting them would refresh the chain over an empty range."""
    return after_version is None or bool(data_commits(table, after_version))


def build_ingest_sensor(interval_s: int, wait_s: float) -> dg.SensorDefinition:
    """The ingest sensor; each tick first waits up to ``wait_s`` for a commit to one of the
    ``CLOSING_TABLES`` (``OrchestrationSettings.sensor_wait_s``)."""

    @dg.sensor(
        name="landing_ingest_sensor",
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(*REFRESH),
        description="Reports a landing table materialization when its Delta version moves and "
        "launches the refresh run (unless one has yet to start: it will read the new versions).",
    )
    def landing_ingest_sensor(
        context: dg.SensorEvaluationContext, lake: LakeResource
    ) -> dg.SensorResult | dg.SkipReason:
        seen: dict[str, int] = json.loads(context.cursor) if context.cursor else {}
        the_lake = lake.lake()
        the_lake.wait_for_commit(CLOSING_TABLES, seen, wait_s)
        events = []
        for table in LANDING_TABLES:
            delta_table = the_lake.open(table)
            if delta_table is None or delta_table.version() == seen.get(table):
                continue
            version, previous = delta_table.version(), seen.get(table)
            seen[table] = version
            if not _data_changed(delta_table, previous):
                continue
            events.append(
                dg.AssetMaterialization(
                    asset_key=table,
                    description=f"Delta version {version}",
                    metadata={
                        "delta_version": version,
                        "previous_delta_version": -1 if previous is None else previous,
                        "dagster/uri": dg.MetadataValue.path(the_lake.uri(table)),
                    },
                )
            )
        if not events:
            context.update_cursor(json.dumps(seen, sort_keys=True))
            return dg.SkipReason("no new data in the landing tables")
        refresh = (
            []
            if has_run_before(context.instance, REFRESH[0])
            else [dg.RunRequest(asset_selection=[dg.AssetKey(key) for key in REFRESH])]
        )
        return dg.SensorResult(
            asset_events=events, run_requests=refresh, cursor=json.dumps(seen, sort_keys=True)
        )

    return landing_ingest_sensor
