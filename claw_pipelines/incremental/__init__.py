"""Reading only what is new, and committing it exactly once.

Owns the machinery of the incremental assets: the watermark an output table carries (a Delta
app transaction per input), an ``Increment`` (one run's version range of its inputs, its
idempotent commits, its chunked recomputes and its carried-over state table), the steps run's
log of closed tails (``closed_tails``), and ``ConcurrentRun``, raised when another run
committed first. The change data feed itself is read by ``lake.changes``. Nothing here needs
Dagster: ``assets/`` wires it into assets.
"""
