"""The served policy version and the weight-sync pause, as one proxy worker applies them.

Every worker keeps a ``ServedPolicy``: the state of ``policy_versions`` (see
``claw_pipelines.policy.versions``), followed by a background thread that polls the table's
Delta log every ``POLL_INTERVAL_S``, and the worker's own count of model calls in flight.
An announce or a pause is committed to the lake before its 200, not spooled: the other workers
and proxies learn of it from the lake, so a spooled one would reach them only a flush later, and
a trainer told "paused" must be able to rely on it. The answering worker adopts it at once.

``PolicyGate`` wraps LiteLLM's app, so every POST the edge forwards to LiteLLM (the model calls;
``/claw`` routes never get there) passes it: while paused a call is held, at most ``max_hold_s``
(then a 503 with ``Retry-After``); once let in it counts as in flight until answered. A call is
served under the version current when it was let in, and lands with it even when an announce
comes while it runs: its tokens came from the weights it started on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from fastapi import APIRouter, HTTPException
from starlette.responses import JSONResponse

from claw_pipelines.identity import TurnIdentity
from claw_pipelines.lake import Lake
from claw_pipelines.policy.versions import (
    TABLE,
    Announce,
    Pause,
    PauseStatus,
    PolicyLog,
    PolicyState,
    PolicyStatus,
)
from claw_pipelines.schemas import PolicyEvent, PolicyEventKind, rows_to_arrow

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.25
RETRY_AFTER_S = 5
served_version: ContextVar[int | None] = ContextVar("claw_served_version", default=None)
"""The version the current model call was let in under (None: none announced)."""


class HeldTooLong(Exception):
    """A model call waited out the whole hold bound and the pause still stands."""


class _Waiters:
    """Coroutines, on any event loop, waiting for a change that another thread may make.
    Every method is called with the policy's lock held."""

    def __init__(self) -> None:
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def add(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        future = loop.create_future()
        self._futures.append((loop, future))
        return future

    def discard(self, future: asyncio.Future) -> None:
        self._futures = [(loop, f) for loop, f in self._futures if f is not future]

    def wake(self) -> None:
        for loop, future in self._futures:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nobody waits
                loop.call_soon_threadsafe(_settle, future)
        self._futures = []


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class ServedPolicy:
    """One worker's view of the served version and pause, and its calls in flight."""

    def __init__(
        self,
        lake: Lake,
        writer_id: str,
        max_hold_s: float,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.writer_id = writer_id
        self.max_hold_s = max_hold_s
        self.poll_interval_s = poll_interval_s
        self.in_flight = 0
        self.held = 0
        self._log = PolicyLog(lake)
        self._writer = lake.writer(TABLE)
        self._lock = threading.Lock()  # the counts and the waiters
        self._log_lock = threading.Lock()  # one lake read or write at a time
        self._resumed = _Waiters()
        self._drained = _Waiters()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    @property
    def state(self) -> PolicyState:
        return self._log.state

    def start(self) -> None:
        """Adopt the lake's state before serving, then follow it."""
        self._poll_logging()
        self._thread = threading.Thread(target=self._follow, name="claw-policy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            self._poll_logging()

    def _poll_logging(self) -> None:
        """A failing poll is logged once per failing spell and retried on the next tick."""
        try:
            self.poll()
        except Exception:
            if not self._failing:
                log.exception("reading %s failed; retrying every %s s", TABLE, self.poll_interval_s)
            self._failing = True
        else:
            self._failing = False

    def poll(self) -> None:
        with self._log_lock:
            changed = self._log.poll()
        if changed:
            with self._lock:
                self._resumed.wake()

    def record(self, event: PolicyEventKind, version: int | None = None) -> PolicyState:
        """Commit an announce (of ``version``) or a pause (of the version served) to the lake
        and adopt it. Stamped after the newest event this worker has read, so an event made
        after seeing another always sorts after it, whatever the clocks of their hosts."""
        with self._log_lock:
            self._log.poll()
            row = PolicyEvent(
                event=event,
                version=self._log.state.version if event == "pause" else version,
                created_at=self._log.next_timestamp(),
                writer_id=self.writer_id,
            )
            self._writer.append(rows_to_arrow(PolicyEvent, [row.model_dump()]))
        self.poll()
        return self.state

    async def admit(self) -> int | None:
        """Let a model call in, counting it in flight, and return the version it is served
        under; while paused, wait for the next announce, at most ``max_hold_s``."""
        with self._lock:
            if not self.state.paused:
                self.in_flight += 1
                return self.state.version
            self.held += 1
        deadline = asyncio.get_running_loop().time() + self.max_hold_s
        try:
            while True:
                if not await self._wait(self._resumed, lambda: not self.state.paused, deadline):
                    raise HeldTooLong
                with self._lock:
                    if not self.state.paused:
                        self.in_flight += 1
                        return self.state.version
        finally:
            with self._lock:
                self.held -= 1

    def release(self) -> None:
        """A call let in by ``admit`` was answered."""
        with self._lock:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._drained.wake()

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for no call to be in flight here; the count left."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        await self._wait(self._drained, lambda: self.in_flight == 0, deadline)
        return self.in_flight

    async def _wait(self, waiters: _Waiters, ready: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``ready()`` (checked under the lock) or the loop time ``deadline``."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if ready():
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                future = waiters.add(loop)
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                pass
            finally:
                with self._lock:
                    waiters.discard(future)

    def status(self) -> PolicyStatus:
        with self._lock:
            counts = {"in_flight": self.in_flight, "held": self.held}
        return PolicyStatus(**self.state.model_dump(), **counts, writer_id=self.writer_id)


class PolicyGate:
    """ASGI wrapper of LiteLLM's app: each POST waits out a pause, then runs counted in flight
    and under the version it was let in with (``served_version``)."""

    def __init__(self, app: Any, policy_of: Callable[[], ServedPolicy]) -> None:
        self.app = app
        self.policy_of = policy_of

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        policy = self.policy_of()
        try:
            version = await policy.admit()
        except HeldTooLong:
            await _held_too_long(policy.max_hold_s)(scope, receive, send)
            return
        token = served_version.set(version)
        try:
            await self.app(scope, receive, send)
        finally:
            served_version.reset(token)
            policy.release()


def _held_too_long(max_hold_s: float) -> JSONResponse:
    message = (
        f"model calls are paused for a weight sync and this one waited {max_hold_s:g} s; "
        "retry: the trainer's next announce resumes them"
    )
    error = {"message": message, "type": "policy_paused", "param": None, "code": None}
    return JSONResponse(
        {"error": error}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)}
    )


def stamp_served_version(
    identity: TurnIdentity, metadata: dict[str, Any] | None
) -> tuple[TurnIdentity, dict[str, Any] | None]:
    """The identity and body metadata a call lands with: once a version was announced, the
    version the call was let in under; an agent's differing claim is kept as
    ``metadata.claw.agent_policy_version``."""
    served = served_version.get()
    if served is None:
        return identity, metadata
    claimed = identity.policy_version
    if claimed is not None and claimed != served:
        claw = {**((metadata or {}).get("claw") or {}), "agent_policy_version": claimed}
        metadata = {**(metadata or {}), "claw": claw}
    return identity.model_copy(update={"policy_version": served}), metadata


def with_announced_version(identity: TurnIdentity, announced: int | None) -> TurnIdentity:
    """A white-box step was generated elsewhere, so the agent's version stands; without one
    it is taken to be the version announced."""
    if identity.policy_version is not None or announced is None:
        return identity
    return identity.model_copy(update={"policy_version": announced})


def policy_router(policy_of: Callable[[], ServedPolicy]) -> APIRouter:
    """``/claw/v1/policy``: what is served, the trainer's announce, and its pause."""
    router = APIRouter()

    async def record(event: PolicyEventKind, version: int | None = None) -> ServedPolicy:
        policy = policy_of()
        try:
            await asyncio.to_thread(policy.record, event, version)
        except Exception as error:
            raise HTTPException(
                503,
                f"could not record the {event} in the lake ({type(error).__name__}: {error}); "
                "nothing changed, retry",
                headers={"Retry-After": "1"},
            ) from error
        return policy

    @router.get("/claw/v1/policy")
    async def current() -> PolicyStatus:
        return policy_of().status()

    @router.post("/claw/v1/policy")
    async def announce(body: Announce) -> PolicyStatus:
        """Every call let in from now on is served under ``version``; resumes a pause."""
        return (await record("announce", body.version)).status()

    @router.post("/claw/v1/policy/pause")
    async def pause(body: Pause | None = None) -> PauseStatus:
        """Hold new model calls on every worker until the next announce; with
        ``drain_timeout_s``, answer once this worker's calls in flight are done."""
        policy = await record("pause")
        at_pause = policy.in_flight
        await policy.drain((body or Pause()).drain_timeout_s)
        return PauseStatus(**policy.status().model_dump(), in_flight_at_pause=at_pause)

    return router
