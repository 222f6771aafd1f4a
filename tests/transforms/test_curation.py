"""Which trajectories new human labels send back through curation."""

from __future__ import annotations

import polars as pl

from claw_pipelines.transforms.curation import labelled_trajectories

SCORED = pl.LazyFrame({"turn_id": ["u1", "u2", "u3"], "trajectory_id": ["t1", "t1", "t2"]})


def _labels(*targets: tuple[str, str]) -> pl.DataFrame:
    kinds, ids = zip(*targets, strict=True)
    return pl.DataFrame({"target_kind": list(kinds), "target_id": list(ids)})


def test_a_step_label_reaches_its_trajectory_through_the_scored_steps():
    labels = _labels(("trajectory", "t7"), ("step", "u3"), ("step", "u-unscored"))
    touched = labelled_trajectories(labels, SCORED)
    assert touched.get_column("trajectory_id").to_list() == ["t7", "t2"]


def test_nothing_is_recurated_before_a_label_or_a_scored_step():
    for touched in (
        labelled_trajectories(None, SCORED),
        labelled_trajectories(_labels(("trajectory", "t1")), None),
    ):
        assert touched.schema == pl.Schema({"trajectory_id": pl.String})
        assert touched.is_empty()
