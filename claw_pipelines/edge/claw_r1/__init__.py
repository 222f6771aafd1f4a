"""Claw-R1's gateway protocol on the proxy port (``--compat claw-r1``): its agents run unchanged.

``config``: the ``claw_compat.claw_r1`` block and what it adds to the LiteLLM config (aliases, the
token-prompt twin); ``served``: what the running proxy knows of it; ``protocol``: Claw-R1's
bodies; ``answers``: its answer shapes; ``rows``: the landing rows its calls make; ``routes``:
the routes, served by the HTTP edge.
"""
