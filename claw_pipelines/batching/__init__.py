"""Batches from curated steps: planning, reservations and retirements.

``planner``: the pure plan of a recipe's next batch (``plan_batch``) and the drops
that are final. ``units``: how a plan picks whole trajectories, complete groups or preference
pairs. ``ledger``: reserving a plan (at most one batch per step) with the pins that re-plan it
exactly. ``retirements``: the steps dropped for good, kept out of later plans until their data
changes. ``building``: a batch's plan (reserved now or re-planned) written to
``batches/<recipe>``. ``checks``: what a written batch passes before export. ``release``: the
one call per Dagster job (build, export, release the ready batches) with plain results. What a
stored batch is (its recipe, names, manifest, pins, rows in export order) lives below, in
``claw_pipelines.batches``. Nothing here needs Dagster: ``assets.batches`` and
``assets.release`` map ``release``'s results, and the inspector previews the next batch with
the same planner.

Words used throughout:

* *pins*: what a reserved batch was planned from (input table versions, the recipe as it
  was, the planning time), kept with its ledger rows; re-planning from them gives the same
  batch.
* *retired*: a step dropped for a reason that later plans would find again (a final drop);
  left out of them until a row of its trajectory or group changes.
* *settled*: consumed by a batch or retired; *in play*: neither, so a later plan may use it.
  ``open_since`` is the earliest start of a step of a trajectory still in play: a plan reads
  the curated steps started since.
"""
