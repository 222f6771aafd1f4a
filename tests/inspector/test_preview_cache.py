"""The preview cache: a plan is reused while its inputs are unchanged, except one waiting for a
straggler timeout, which depends on the clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import polars as pl
import pytest

from claw_pipelines.config_files import recipes
from claw_pipelines.inspector import batch_preview
from claw_pipelines.inspector.batch_preview import Preview, PreviewCache


@pytest.mark.parametrize(("reason", "plans"), [("waiting_for_group", 2), ("next_batch", 1)])
def test_a_plan_waiting_for_stragglers_is_replanned_once_it_is_old(monkeypatch, reason, plans):
    planned: list[str] = []

    def plan(lake, state, recipe) -> Preview:
        planned.append(recipe.name)
        dropped = SimpleNamespace(dropped=pl.DataFrame({"reason": [reason]}))
        long_ago = datetime.now(UTC) - timedelta(seconds=PreviewCache.WAITING_REPLAN_S + 1)
        return Preview(recipe, "", dropped, pl.DataFrame(), pl.DataFrame(), None, long_ago)

    monkeypatch.setattr(batch_preview, "preview", plan)
    cache, state = PreviewCache(lake=None), SimpleNamespace(versions={"scored_steps": 3})
    for _ in range(2):
        cache.get(state, recipes()["grpo"])
    assert len(planned) == plans
