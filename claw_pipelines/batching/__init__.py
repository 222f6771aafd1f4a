"""Batches from curated steps: recipes, planning, reservations and retirements.

``recipe``: a recipe of assets/batches.yaml, refused at load when it would make every batch
useless. ``planner``: the pure plan of a recipe's next batch (``plan_batch``) and the drops
that are final. ``units``: how a plan picks whole trajectories, complete groups or preference
pairs. ``ledger``: reserving a plan (at most one batch per step) with the pins that re-plan it
exactly. ``retirements``: the steps dropped for good, kept out of later plans until their data
changes. Nothing here needs Dagster: ``assets.batches`` and ``assets.release`` wire it, and the
inspector previews the next batch with the same planner.
"""
