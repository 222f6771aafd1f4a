"""The trainer's side of policy versions: announce the version served, pause for a weight sync.

A training loop syncing weights into the engine behind the proxy does::

    with PolicyClient("http://127.0.0.1:4000", key) as policy:
        policy.pause(drain_timeout_s=60)   # new model calls wait; in-flight ones finish
        sync_weights()                     # the trainer's own weight update
        policy.announce(step)              # resumes; later turns carry `step`

Every proxy worker on the lake adopts an announce or a pause within a second; the answer counts
the calls in flight of the worker that answered (``PauseStatus``).
"""

from __future__ import annotations

import httpx

from claw_pipelines.policy.versions import PauseStatus, PolicyStatus


class PolicyClient:
    """``/claw/v1/policy`` over httpx, with the proxy key. Errors raise
    ``httpx.HTTPStatusError``; a 503 means nothing was recorded, and the call may be retried."""

    def __init__(self, proxy_url: str, key: str, timeout_s: float = 120.0) -> None:
        self._http = httpx.Client(
            base_url=proxy_url.rstrip("/"),
            headers={"authorization": f"Bearer {key}"},
            timeout=timeout_s,
        )

    def announce(self, version: int) -> PolicyStatus:
        """Model calls let in from now on are served (and land) under ``version``; resumes a
        pause."""
        return PolicyStatus.model_validate(self._call("POST", "", {"version": version}))

    def pause(self, drain_timeout_s: float = 0) -> PauseStatus:
        """Hold new model calls until the next ``announce``; with ``drain_timeout_s``, return
        once the answering worker's calls in flight are done (or the time is up)."""
        body = {"drain_timeout_s": drain_timeout_s}
        return PauseStatus.model_validate(self._call("POST", "/pause", body))

    def current(self) -> PolicyStatus:
        return PolicyStatus.model_validate(self._call("GET", ""))

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        response = self._http.request(method, f"/claw/v1/policy{path}", json=body)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
