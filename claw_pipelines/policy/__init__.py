"""Which policy version the proxies serve: the ``policy_versions`` table a trainer's announces
and pauses land in (``versions``), and the gate each proxy worker applies it with (``gate``:
holding calls during a weight sync, stamping the version served). It imports nothing of capture,
so a trainer or a batch planner reading the table never loads the proxy."""
