"""Reading only what is new, and committing it exactly once.

Owns the machinery of the incremental assets: the watermark an output table carries (a Delta
app transaction per input), an ``Increment`` (one run's version range of its inputs, its
idempotent commits, its chunked recomputes and its carried-over state table), the steps run's
log of closed tails (``closed_tails``) and its backlog in chunks (``turn_chunks``), and each
derived table's run over its ``Increment`` (``steps_refresh``, ``trajectories_refresh``,
``rewards_refresh``, ``quality_refresh``), which an asset calls once; a run that lost a commit
race raises ``lake.commits.ConcurrentRun``. The change data feed is read by ``lake.changes``.
Nothing here needs Dagster: ``assets/`` wires it into assets.

Words used throughout:

* *watermark*: per input, the Delta version an output has read up to, committed with its rows.
* *attempt*: one try of a run (a race, a retry), with an id of its own on every commit.
* *state*: rows a run carries over to the next (the turns of trajectories still open).
* *tail*: what is kept of a closed trajectory for its reopen window (its last step and the
  turns it emitted), so a late turn extends it instead of starting a new one.
"""
