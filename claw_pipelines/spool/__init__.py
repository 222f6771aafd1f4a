"""The spool: where a landing row becomes durable on the proxy's disk before its answer leaves,
and how sealed segments reach the lake (``writer``, its frame format ``codec``, ``flusher``,
``staging`` for a fleet's one committer, ``commit_rules``). It knows rows and the lake, not
where the rows came from: capture and the edge write to it, it imports neither."""
