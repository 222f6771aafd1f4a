"""The proxy's HTTP edge: the ASGI app around LiteLLM (``asgi``), its body and shape checks,
the Responses/Messages bridges' serving, re-streaming and token-ID prompts, the ``/claw/v1``
routes (``control``), Claw-R1's gateway routes (``claw_r1``) and ``claw proxy`` (``launcher``).
It sits on top: it wires capture's runtime, the spool and the policy gate into one server, and
nothing below imports it."""
