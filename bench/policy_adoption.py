"""Policy adoption: how long after an announce's 200 every proxy worker on the lake serves it.

Starts the embedded engine, a two-worker proxy and a one-worker proxy on one lake, announces
``--announces`` versions (through each proxy in turn) and after each polls
``GET /claw/v1/policy`` on both until each of the three workers has reported the new version.
GETs go on new connections, several at once, so the kernel spreads them over the two workers;
the time a worker is first seen with the version is an upper bound of when it adopted it. The
baseline is what an announce must do at least: one bare Delta commit of one row, measured in the
same run. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import pyarrow as pa
from deltalake import write_deltalake

from claw_pipelines.policy.gate import POLL_INTERVAL_S
from claw_pipelines.processes import Service, free_port
from claw_pipelines.stack import start_engine, start_proxy

WORKERS = 3
DEADLINE_S = 30
STARTUP_S = 300


async def _adoption(
    client: httpx.AsyncClient,
    proxies: list[Service],
    version: int | None,
    deadline_s: float = DEADLINE_S,
) -> float:
    """Seconds from now until every worker was seen serving ``version`` (None: any version,
    i.e. up: a proxy answers once its first worker is, and a loaded machine starts the second
    one tens of seconds later)."""
    start = time.perf_counter()
    seen: set[str] = set()
    while len(seen) < WORKERS:
        if time.perf_counter() - start > deadline_s:
            raise TimeoutError(f"only {len(seen)} workers adopted version {version}")
        targets = [proxies[0]] * 4 + [proxies[1]]
        answers = await asyncio.gather(
            *(client.get(f"{proxy.url}/claw/v1/policy") for proxy in targets)
        )
        seen |= {a.json()["writer_id"] for a in answers if version in (None, a.json()["version"])}
    return time.perf_counter() - start


async def _announces(key: str, proxies: list[Service], count: int) -> tuple[list, list]:
    adoption, round_trip = [], []
    limits = httpx.Limits(max_keepalive_connections=0)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:
        await _adoption(client, proxies, None, STARTUP_S)
        for version in range(1, count + 1):
            via = proxies[version % 2]
            start = time.perf_counter()
            answer = await client.post(f"{via.url}/claw/v1/policy", json={"version": version})
            answer.raise_for_status()
            round_trip.append((time.perf_counter() - start) * 1000)
            adoption.append(await _adoption(client, proxies, version))
    return adoption, round_trip


def _bare_commits(root: Path, count: int) -> list[float]:
    """Milliseconds per one-row append to a Delta table, as an announce commits one row."""
    table = str(root / "bare")
    write_deltalake(table, pa.table({"version": [0]}), mode="append")
    latencies = []
    for version in range(1, count + 1):
        start = time.perf_counter()
        write_deltalake(table, pa.table({"version": [version]}), mode="append")
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def _measure(root: Path, announces: int) -> tuple[list, list]:
    key = "sk-bench-" + secrets.token_hex(16)
    env = {
        "CLAW_LAKE_URI": str(root / "lake"),
        "CLAW_SPOOL_DIR": str(root / "spool"),
        "LITELLM_MASTER_KEY": key,
    }
    engine = start_engine(free_port(), root, env)
    services = [engine]
    try:
        engine.wait_ready("/health", timeout_s=60)
        for name, workers in (("two", 2), ("one", 1)):
            (root / name).mkdir()
            backend = f"{engine.url}/v1"
            services.append(start_proxy(free_port(), root / name, backend, env, workers))
        for proxy in services[1:]:
            proxy.wait_ready("/health/liveliness", timeout_s=300)
        return asyncio.run(_announces(key, services[1:], announces))
    finally:
        for service in reversed(services):
            service.stop()


QUICK = {"announces": 3}
"""``--quick``: the same proxies, three announces, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--announces", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    with tempfile.TemporaryDirectory(prefix="claw-policy-bench-") as tmp:
        adoption, round_trip = _measure(Path(tmp), args.announces)
        bare = _bare_commits(Path(tmp), args.announces)
    quantiles = statistics.quantiles(adoption, n=20)
    announce_ms, bare_ms = statistics.median(round_trip), statistics.median(bare)
    print(
        json.dumps(
            {
                "announces": len(adoption),
                "workers": WORKERS,
                "poll_interval_s": POLL_INTERVAL_S,
                "adoption_p50_s": round(statistics.median(adoption), 3),
                "adoption_p95_s": round(quantiles[18], 3),
                "adoption_max_s": round(max(adoption), 3),
                "announce_p50_ms": round(announce_ms, 1),
                "bare_commit_p50_ms": round(bare_ms, 1),
                "announce_vs_bare_commit": round(announce_ms / bare_ms, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
