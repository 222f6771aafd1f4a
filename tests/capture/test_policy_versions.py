"""Policy versions from the trainer over real proxies: two proxies on one lake, one with two
workers (fast engine), one with a slow engine and a short hold bound. The pause and the version
are lake-wide, so each test announces a fresh version first and leaves calls resumed."""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai
import polars as pl
import pytest
from stack_fixtures import PROXY_START_TIMEOUT_S, capture_env

from claw_pipelines.engine.server import LATENCY_ENV
from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port
from claw_pipelines.stack import start_engine, start_proxy
from claw_pipelines.trainer.policy import PolicyClient

SLOW_ENGINE_MS = 3000
SHORT_HOLD_S = 2
DEADLINE_S = 60
"""Generous: adoption takes about a poll interval (0.25 s); this only bounds a broken test."""
VERSIONS = itertools.count(100, 10)


@dataclass
class Proxies:
    """Two proxies on one lake: ``two_workers`` (2 workers) and ``slow`` (1 worker)."""

    lake: Lake
    key: str
    two_workers: Service
    slow: Service

    def client(self, proxy: Service) -> PolicyClient:
        return PolicyClient(proxy.url, self.key)


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxies]:
    root = tmp_path_factory.mktemp("policy")
    key = "sk-test-" + secrets.token_hex(16)
    env = capture_env(root, key)
    services: list[Service] = []
    try:
        for name, latency in (("a", 0), ("b", SLOW_ENGINE_MS)):
            (root / name).mkdir()
            engine_env = {**env, LATENCY_ENV: str(latency)}
            services.append(start_engine(free_port(), root / name, engine_env))
        for engine in services[:2]:
            engine.wait_ready("/health", timeout_s=60)
        fast, slow = services
        services.append(start_proxy(free_port(), root / "a", f"{fast.url}/v1", env, num_workers=2))
        short_hold = {**env, "CLAW_PAUSE_MAX_HOLD_S": str(SHORT_HOLD_S)}
        services.append(start_proxy(free_port(), root / "b", f"{slow.url}/v1", short_hold))
        for proxy in services[2:]:
            proxy.wait_ready("/health/liveliness", timeout_s=PROXY_START_TIMEOUT_S)
        yield Proxies(Lake(env["CLAW_LAKE_URI"]), key, services[2], services[3])
    finally:
        for service in reversed(services):
            service.stop()


def _status(proxies: Proxies, proxy: Service) -> dict:
    """One GET on a new connection, so either worker of a two-worker proxy may answer."""
    answer = httpx.get(
        f"{proxy.url}/claw/v1/policy", headers={"authorization": f"Bearer {proxies.key}"}
    )
    answer.raise_for_status()
    return answer.json()


def _workers_seeing(proxies: Proxies, proxy: Service, workers: int, wanted) -> set[str]:
    """Poll ``proxy`` until ``workers`` distinct workers answered a status ``wanted`` accepts
    (several GETs at once, so the kernel hands them to different workers)."""
    seen: set[str] = set()
    deadline = time.monotonic() + DEADLINE_S
    while len(seen) < workers and time.monotonic() < deadline:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: _status(proxies, proxy), range(4)))
        seen |= {a["writer_id"] for a in answers if wanted(a)}
    return seen


def _everywhere(proxies: Proxies, wanted) -> None:
    """Wait until both workers of one proxy and the other proxy report a state ``wanted``
    accepts."""
    assert len(_workers_seeing(proxies, proxies.two_workers, 2, wanted)) == 2
    assert len(_workers_seeing(proxies, proxies.slow, 1, wanted)) == 1


def _announced(proxies: Proxies, via: Service) -> int:
    version = next(VERSIONS)
    with proxies.client(via) as client:
        assert client.announce(version).version == version
    _everywhere(proxies, lambda s: s["version"] == version and not s["paused"])
    return version


def _call(proxies: Proxies, proxy: Service, headers: dict | None = None) -> str:
    client = openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key=proxies.key, max_retries=0, timeout=120
    )
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model="policy",
            messages=[{"role": "user", "content": "What is 2 + 3?"}],
            max_tokens=16,
            extra_headers=headers,
        )
    return raw.headers["x-litellm-call-id"]


def _turns(proxies: Proxies, turn_ids: list[str]) -> dict[str, dict]:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        scan = proxies.lake.scan("turns")
        rows = pl.DataFrame() if scan is None else scan.collect()
        if not rows.is_empty() and set(turn_ids) <= set(rows["turn_id"]):
            return {row["turn_id"]: row for row in rows.iter_rows(named=True)}
        time.sleep(0.2)
    raise AssertionError(f"turns {turn_ids} did not land")


class _Call(threading.Thread):
    """A model call made in the background, so a test can watch it being held or in flight."""

    def __init__(self, proxies: Proxies, proxy: Service) -> None:
        super().__init__(daemon=True)
        self.proxies, self.proxy = proxies, proxy
        self.turn_id: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.turn_id = _call(self.proxies, self.proxy)
        except BaseException as error:
            self.error = error

    def result(self) -> str:
        self.join(timeout=DEADLINE_S)
        assert self.error is None and self.turn_id is not None, self.error
        return self.turn_id


def test_an_announce_reaches_both_workers_and_the_other_proxy(proxies: Proxies) -> None:
    for via in (proxies.slow, proxies.two_workers):
        version = _announced(proxies, via)
        with proxies.client(proxies.slow) as client:
            assert client.current().version == version
    events = proxies.lake.scan("policy_versions").collect()
    assert events.filter(pl.col("event") == "announce")["version"].max() == version


def test_turns_after_an_announce_carry_it_and_keep_a_differing_agent_version(
    proxies: Proxies,
) -> None:
    version = _announced(proxies, proxies.two_workers)
    differing = _call(proxies, proxies.two_workers, {"x-claw-policy-version": str(version - 5)})
    agreeing = _call(proxies, proxies.two_workers, {"x-claw-policy-version": str(version)})
    unclaimed = [_call(proxies, proxies.two_workers), _call(proxies, proxies.slow)]
    turns = _turns(proxies, [differing, agreeing, *unclaimed])
    for turn_id in (differing, agreeing, *unclaimed):
        assert turns[turn_id]["policy_version"] == version
    claw = json.loads(turns[differing]["metadata"])["claw"]
    assert claw["agent_policy_version"] == version - 5
    for turn_id in (agreeing, *unclaimed):
        metadata = json.loads(turns[turn_id]["metadata"] or "{}")
        assert "agent_policy_version" not in metadata.get("claw", {})


def test_a_pause_holds_calls_until_the_next_announce(proxies: Proxies) -> None:
    _announced(proxies, proxies.two_workers)
    with proxies.client(proxies.two_workers) as client:
        assert client.pause().paused
        _everywhere(proxies, lambda s: s["paused"])
        call = _Call(proxies, proxies.two_workers)
        call.start()
        assert _workers_seeing(proxies, proxies.two_workers, 1, lambda s: s["held"] == 1)
        assert call.is_alive() and call.turn_id is None
        resumed = next(VERSIONS)
        client.announce(resumed)
    turn_id = call.result()
    assert _turns(proxies, [turn_id])[turn_id]["policy_version"] == resumed


def test_a_call_held_past_the_bound_gets_a_503_with_retry_after(proxies: Proxies) -> None:
    _announced(proxies, proxies.slow)
    with proxies.client(proxies.slow) as client:
        client.pause()
        try:
            answer = httpx.post(
                f"{proxies.slow.url}/v1/chat/completions",
                headers={"authorization": f"Bearer {proxies.key}"},
                json={"model": "policy", "messages": [{"role": "user", "content": "1 + 1?"}]},
                timeout=DEADLINE_S,
            )
        finally:
            client.announce(next(VERSIONS))
    assert answer.status_code == 503
    assert int(answer.headers["retry-after"]) > 0
    error = answer.json()["error"]
    assert error["type"] == "policy_paused" and f"{SHORT_HOLD_S} s" in error["message"]


def test_a_call_in_flight_finishes_during_a_pause_under_the_version_it_started_with(
    proxies: Proxies,
) -> None:
    started_under = _announced(proxies, proxies.slow)
    call = _Call(proxies, proxies.slow)
    call.start()
    assert _workers_seeing(proxies, proxies.slow, 1, lambda s: s["in_flight"] == 1)
    with proxies.client(proxies.slow) as client:
        paused = client.pause(drain_timeout_s=DEADLINE_S)
        assert (paused.paused, paused.in_flight_at_pause, paused.in_flight) == (True, 1, 0)
        turn_id = call.result()
        client.announce(next(VERSIONS))
    assert _turns(proxies, [turn_id])[turn_id]["policy_version"] == started_under


def test_the_policy_routes_take_the_proxy_key(proxies: Proxies) -> None:
    answer = httpx.post(f"{proxies.two_workers.url}/claw/v1/policy", json={"version": 1})
    assert answer.status_code == 401
    with proxies.client(proxies.two_workers) as client:
        assert client.current().version != 1
