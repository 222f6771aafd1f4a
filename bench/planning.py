"""Benchmark: planning a batch over a backlog of steps dropped for good, with and without retiring.

GRPO drops every group whose rewards are all equal, and in practice that is a large share of
them. Lands N single-step rollouts (groups of 4, ``--flat-share`` of them zero-variance, every
other group consumed by one big batch), runs the asset chain, then, each in a fresh process so
its peak RSS is its own:

* ``first``: the first plan after the build: reads the whole backlog and retires it;
* ``next``: +1 ready group landed and the chain re-run, the next plan (leaves the retired steps
  out and reads the tables from the oldest trajectory still in play);
* ``unretired``: the same plan without retirements or that start, reading everything: what
  every plan cost before;
* ``preview``: the inspector's preview of the next batch (its index loaded first, not timed),
  which plans with the retirements that still stand as well.

Prints one JSON object: seconds and ``peak_rss_mib`` per plan, and ``next_over_unretired``.

    .venv/bin/python bench/planning.py [--turns 100000] [--flat-share 0.5]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from pipeline import CHAIN, GROUP_SIZE, flat_groups, land, peak_rss_mib, run_phase

from claw_pipelines.lake import Lake


def _chain(lake: Lake) -> None:
    import dagster as dg

    from assets.definitions import build_definitions
    from resources.lake import LakeResource

    defs = build_definitions(lake=LakeResource(lake_uri=lake.root))
    keys = [dg.AssetKey(k) for k in CHAIN]
    job = defs.resolve_implicit_job_def_def_for_assets(keys)
    if not job.execute_in_process(asset_selection=keys).success:
        raise RuntimeError("the asset chain failed")


def phase_plan(lake: Lake, batch_id: str, groups: int, retired: bool) -> dict:
    """One ``ledger.reserve`` of a grpo batch of ``groups`` groups (``retired=False``: a plan
    from the same inputs that reads everything, and records nothing)."""
    import pyarrow.compute  # noqa: F401  (imported once by the long-running planner, not per plan)

    from claw_pipelines.batches.names import ledger_table
    from claw_pipelines.batches.pins import Pins
    from claw_pipelines.batching import ledger
    from claw_pipelines.config_files import recipes
    from claw_pipelines.schemas import utc_now

    recipe = recipes()["grpo"].model_copy(update={"groups_per_batch": groups})
    started = time.perf_counter()
    if retired:
        reserved = ledger.reserve(lake, recipe, batch_id, utc_now())
        rows = 0 if reserved is None else reserved.plan.planned.height
    else:
        pins = Pins(
            curated_steps=lake.version("curated_steps"),
            steps=lake.version("steps"),
            batch_ledger=lake.version(ledger_table(recipe.name)),
            planned_at=utc_now(),
        )
        rows = ledger.plan_from_pins(lake, recipe, batch_id, pins).planned.height
    return {"seconds": time.perf_counter() - started, "batch_rows": rows}


def phase_preview(lake: Lake) -> dict:
    """The inspector's grpo batch preview over its index of the lake."""
    from claw_pipelines import config_files
    from claw_pipelines.inspector.batch_preview import preview
    from claw_pipelines.inspector.tables import LakeIndex

    recipes = config_files.recipes()
    state = LakeIndex(lake, list(recipes)).refresh()
    started = time.perf_counter()
    planned = preview(lake, state, recipes["grpo"])
    return {"seconds": time.perf_counter() - started, "batch_rows": planned.plan.planned.height}


QUICK = {"turns": 800}
"""``--quick``: every phase on a tiny lake, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--flat-share", type=float, default=0.5)
    parser.add_argument("--phase", choices=["chain", "plan", "preview"], help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    parser.add_argument("--batch-id", help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--unretired", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    if args.phase:
        lake = Lake(args.lake)
        if args.phase == "chain":
            _chain(lake)
            measured = {}
        elif args.phase == "preview":
            measured = phase_preview(lake)
        else:
            measured = phase_plan(lake, args.batch_id, args.groups, not args.unretired)
        print(json.dumps({**measured, "peak_rss_mib": round(peak_rss_mib(), 1)}))
        return

    turns = args.turns - args.turns % GROUP_SIZE
    with tempfile.TemporaryDirectory(prefix="claw-bench-") as root:
        lake = Lake(str(Path(root) / "lake"))
        land(lake, 0, turns, seed=0, flat_share=args.flat_share)
        run_phase(["--phase", "chain", "--lake", lake.root], script=__file__)
        groups = turns // GROUP_SIZE
        trainable = groups - flat_groups(groups, args.flat_share)
        plan = ["--phase", "plan", "--lake", lake.root]
        first = run_phase([*plan, "--batch-id", "grpo-000001", "--groups", str(trainable)],
                          script=__file__)  # fmt: skip
        land(lake, turns, GROUP_SIZE, seed=1)
        run_phase(["--phase", "chain", "--lake", lake.root], script=__file__)
        then = [*plan, "--batch-id", "grpo-000002", "--groups", "1"]
        unretired = run_phase([*then, "--unretired"], script=__file__)
        previewed = run_phase(["--phase", "preview", "--lake", lake.root], script=__file__)
        following = run_phase(then, script=__file__)
    print(
        json.dumps(
            {
                "turns": turns,
                "flat_share": args.flat_share,
                "first_plan_seconds": round(first["seconds"], 3),
                "first_plan_batch_rows": first["batch_rows"],
                "first_plan_peak_rss_mib": first["peak_rss_mib"],
                "next_plan_seconds": round(following["seconds"], 3),
                "next_plan_batch_rows": following["batch_rows"],
                "next_plan_peak_rss_mib": following["peak_rss_mib"],
                "unretired_plan_seconds": round(unretired["seconds"], 3),
                "unretired_plan_peak_rss_mib": unretired["peak_rss_mib"],
                "next_over_unretired": round(following["seconds"] / unretired["seconds"], 3),
                "preview_seconds": round(previewed["seconds"], 3),
                "preview_batch_rows": previewed["batch_rows"],
                "ok": first["batch_rows"] > 0
                and following["batch_rows"] == unretired["batch_rows"] > 0
                and previewed["batch_rows"] > 0,
            }
        )
    )


if __name__ == "__main__":
    main()
