"""When derived assets refresh: declarative automation conditions and the sensor evaluating them."""

from __future__ import annotations

import dagster as dg

from assets.landing import LANDING_TABLES

AC = dg.AutomationCondition

IDLE_SWEEP_CRON = "*/5 * * * *"
"""How often ``steps`` re-runs without new turns, so idle trajectories time out and close."""


def on_new_data() -> dg.AutomationCondition:
    """``eager()``, except that a landing table that never received a row does not block.

    ``rewards`` or ``labels`` may stay empty forever (outcome rewards can come with trajectory
    events; curation is optional), and plain eager waits for every dependency to exist.
    A dependency refreshed in the same run gates it through its blocking checks in that run; one
    refreshed earlier must have passed them, so a failed check keeps stopping the chain.
    """
    return (
        (AC.newly_missing() | AC.any_deps_updated()).since_last_handled()
        & ~AC.any_deps_missing().ignore(dg.AssetSelection.assets(*LANDING_TABLES))
        & ~AC.any_deps_in_progress()
        & ~AC.in_progress()
        & AC.all_deps_match(
            AC.will_be_requested() | AC.all_checks_match(AC.check_passed(), blocking_only=True)
        )
    ).with_label("on new data")


def on_new_data_or_idle_sweep() -> dg.AutomationCondition:
    """``on_new_data`` plus a periodic run that closes trajectories past their idle timeout."""
    return (
        on_new_data()
        | (AC.cron_tick_passed(IDLE_SWEEP_CRON).since_last_handled() & ~AC.in_progress())
    ).with_label("on new data or idle sweep")


def build_automation_sensor(interval_s: int) -> dg.AutomationConditionSensorDefinition:
    return dg.AutomationConditionSensorDefinition(
        name="claw_automation_sensor",
        target=dg.AssetSelection.all(),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=interval_s,
        description="Evaluates the derived assets' automation conditions (running by default).",
    )
