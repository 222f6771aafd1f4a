"""Capture overhead: the proxy with the capture callback vs the same proxy without it, per route.

Both are started by ``claw proxy`` with the same uvicorn settings, against the same embedded
engine, with the same request mix (non-streaming) and concurrency, in rounds of one run; every
route is served on both proxies before anything is measured, and who goes first alternates
round by round, so neither one-off start-up costs nor drift with the processes' age fall on one
proxy or route.
``--no-capture`` drops the callback and the HTTP edge but keeps the start-up heap freeze
(``edge/frozen_heap.py``), so the two differ by capture alone; its model also sets LiteLLM's
``use_chat_completions_api``, so on ``/v1/responses`` the bare proxy does what the capture bridge
does (translate to the engine's chat call: the engine has no Responses route) minus capture. On
``/v1/messages`` both translate through chat (LiteLLM's Anthropic adapter, and the bridge).
Prints one JSON object: per route ``throughput_ratio`` under load, ``cpu_ratio`` (the bare
proxy's CPU per call over the capture proxy's, the steadier figure on a shared machine) and
``p50/p99_added_ms`` over sequential calls that alternate between the two proxies call by call
(the machine's drift between rounds, several ms per call on two shared cores, falls on both
alike), pooled over the rounds, and the worst of each over the routes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import yaml

from claw_pipelines.edge.launcher import DEFAULT_CONFIG
from claw_pipelines.processes import Service, free_port
from claw_pipelines.stack import start_engine, start_proxy

QUESTION = "What is 12 + 30?"
ROUTES: dict[str, tuple[str, dict]] = {
    "chat": (
        "/v1/chat/completions",
        {
            "model": "policy",
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 32,
            "logprobs": True,
            "return_token_ids": True,
        },
    ),
    "responses": (
        "/v1/responses",
        {"model": "policy", "input": QUESTION, "max_output_tokens": 32},
    ),
    "messages": (
        "/v1/messages",
        {"model": "policy", "max_tokens": 32, "messages": [{"role": "user", "content": QUESTION}]},
    ),
}
WARM_UP_CALLS = 200
FIRST_COMMIT_WAIT_S = 3.0
"""Longer than the spool's pause before a commit, so the warm-up's turns are committed."""


async def drive(url: str, key: str, route: str, requests: int, concurrency: int) -> list[float]:
    """Send ``requests`` calls with ``concurrency`` in flight; return latencies in ms."""
    path, body = ROUTES[route]
    latencies: list[float] = []
    queue = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60, limits=limits
    ) as client:

        async def worker() -> None:
            for _ in queue:
                start = time.perf_counter()
                response = await client.post(path, json=body)
                response.raise_for_status()
                latencies.append((time.perf_counter() - start) * 1000)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def drive_paired(urls: dict[str, str], key: str, route: str, requests: int) -> dict:
    """Sequential calls that alternate between the proxies call by call (who goes first
    alternates too), so the machine's drift between rounds falls on both alike; return each
    proxy's latencies in ms."""
    path, body = ROUTES[route]
    headers = {"authorization": f"Bearer {key}"}
    latencies: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    clients = {
        name: httpx.AsyncClient(base_url=url, headers=headers, timeout=60)
        for name, url in urls.items()
    }
    try:
        for call in range(requests):
            for name in names if call % 2 else reversed(names):
                start = time.perf_counter()
                response = await clients[name].post(path, json=body)
                response.raise_for_status()
                latencies[name].append((time.perf_counter() - start) * 1000)
    finally:
        for client in clients.values():
            await client.aclose()
    return latencies


def paired_latencies(urls: dict[str, str], key: str, route: str, requests: int) -> dict:
    """Each proxy's latencies in ms over paired sequential calls, after a warm-up."""
    asyncio.run(drive_paired(urls, key, route, max(20, requests // 10)))
    return asyncio.run(drive_paired(urls, key, route, requests))


def quantiles_ms(values: list[float]) -> dict[str, float]:
    cut = statistics.quantiles(values, n=100)
    return {"p50_ms": cut[49], "p99_ms": cut[98]}


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) of a process and its children so far."""
    leader = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [leader, *leader.children(recursive=True)])


def warm_up(proxies: dict[str, Service], key: str, routes: list[str], concurrency: int) -> None:
    """Serve every route on every proxy before anything is measured, so one-off costs (first
    imports, the capture proxy's first Delta commit) fall on no route's figures; the first
    route measured used to pay them."""
    for route in routes:
        for proxy in proxies.values():
            asyncio.run(drive(proxy.url, key, route, WARM_UP_CALLS, concurrency))
    time.sleep(FIRST_COMMIT_WAIT_S)


def round_order(round_index: int) -> tuple[str, str]:
    """Which proxy goes first alternates round by round (ABBA): CPU per call drifts as both
    processes age, and a fixed order would charge that drift to the proxy measured second."""
    return ("without", "with") if round_index % 2 == 0 else ("with", "without")


def measure(
    proxy: Service, key: str, route: str, requests: int, concurrency: int
) -> dict[str, float]:
    """Throughput, latency quantiles and the proxy's CPU per call: on a shared machine the CPU
    a call costs is steadier than how many calls a second the machine lets through."""
    asyncio.run(drive(proxy.url, key, route, max(50, requests // 10), concurrency))
    cpu = cpu_seconds(proxy.pid)
    start = time.perf_counter()
    latencies = asyncio.run(drive(proxy.url, key, route, requests, concurrency))
    elapsed = time.perf_counter() - start
    cpu_ms = (cpu_seconds(proxy.pid) - cpu) * 1000 / len(latencies)
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": quantiles[49],
        "p99_ms": quantiles[98],
        "cpu_ms_per_call": cpu_ms,
    }


def bare_config(workdir: Path) -> Path:
    """The default config, with LiteLLM's own Responses-to-chat bridge on the default model."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for entry in config["model_list"]:
        entry["litellm_params"]["use_chat_completions_api"] = True
    path = workdir / "litellm-bare.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def stack_env(workdir: Path) -> tuple[str, dict[str, str]]:
    """A fresh master key and the environment an engine and the proxies under test share."""
    key = "sk-bench-" + secrets.token_hex(16)
    return key, {
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "CLAW_LAKE_URI": str(workdir / "lake"),
        "CLAW_SPOOL_DIR": str(workdir / "spool"),
    }


def summary(load: dict, latency: dict[str, list[list[float]]]) -> dict[str, float]:
    """Throughput and CPU: medians over rounds. Latency: quantiles of every round's calls
    pooled, so p99 rests on a hundredth of all the calls rather than on a round's few slowest
    (at 300 calls a round, its third slowest)."""

    def median(runs: list[dict[str, float]], metric: str) -> float:
        return statistics.median(run[metric] for run in runs)

    rps = {name: median(load[name], "rps") for name in load}
    cpu = {name: median(load[name], "cpu_ms_per_call") for name in load}
    pooled = {
        name: quantiles_ms([ms for run in runs for ms in run]) for name, runs in latency.items()
    }
    p50 = {name: q["p50_ms"] for name, q in pooled.items()}
    p99 = {name: q["p99_ms"] for name, q in pooled.items()}
    return {
        "rps_with_capture": round(rps["with"], 1),
        "rps_without_capture": round(rps["without"], 1),
        "throughput_ratio": round(rps["with"] / rps["without"], 3),
        "cpu_ms_per_call_with": round(cpu["with"], 2),
        "cpu_ms_per_call_without": round(cpu["without"], 2),
        "cpu_ratio": round(cpu["without"] / cpu["with"], 3),
        "p50_ms_with": round(p50["with"], 2),
        "p50_ms_without": round(p50["without"], 2),
        "p99_ms_with": round(p99["with"], 2),
        "p99_ms_without": round(p99["without"], 2),
        "p50_added_ms": round(p50["with"] - p50["without"], 2),
        "p99_added_ms": round(p99["with"] - p99["without"], 2),
        "throughput_runs": load,
        "latency_runs": {
            name: [quantiles_ms(run) for run in runs] for name, runs in latency.items()
        },
    }


def measure_route(
    proxies: dict[str, Service],
    key: str,
    route: str,
    rounds: int,
    requests: int,
    concurrency: int,
    latency_requests: int,
) -> dict:
    """``summary`` of ``rounds`` rounds on ``route``: each proxy under load (who goes first
    alternating), then sequential calls alternating between them."""
    load: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    latency: dict[str, list[list[float]]] = {"with": [], "without": []}
    for round_index in range(rounds):
        for name in round_order(round_index):
            load[name].append(measure(proxies[name], key, route, requests, concurrency))
        urls = {name: proxy.url for name, proxy in proxies.items()}
        paired = paired_latencies(urls, key, route, latency_requests)
        for name in latency:
            latency[name].append(paired[name])
    return summary(load, latency)


QUICK = {"requests": 16, "concurrency": 4, "latency_requests": 8, "rounds": 1}
"""``--quick``: both proxies on every route, a few calls each, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=600, help="per throughput round")
    parser.add_argument("--concurrency", type=int, default=16, help="for throughput")
    parser.add_argument(
        "--latency-requests", type=int, default=300, help="sequential, per proxy and round"
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds per proxy, who goes first alternating"
    )
    parser.add_argument("--routes", nargs="+", choices=list(ROUTES), default=list(ROUTES))
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    workdir = Path(tempfile.mkdtemp(prefix="claw-bench-capture-"))
    key, env = stack_env(workdir)
    engine = start_engine(free_port(), workdir, env)
    services = [engine]
    results = {}
    try:
        engine.wait_ready("/health", timeout_s=60)
        backend = f"{engine.url}/v1"
        (workdir / "plain").mkdir()
        proxies = {
            "with": start_proxy(free_port(), workdir, backend, env),
            "without": start_proxy(
                free_port(),
                workdir / "plain",
                backend,
                env,
                capture=False,
                config=bare_config(workdir),
            ),
        }
        services += proxies.values()
        for proxy in proxies.values():
            proxy.wait_ready("/health/liveliness", timeout_s=300)
        warm_up(proxies, key, args.routes, args.concurrency)
        for route in args.routes:
            results[route] = measure_route(
                proxies,
                key,
                route,
                args.rounds,
                args.requests,
                args.concurrency,
                args.latency_requests,
            )
    finally:
        for service in reversed(services):
            service.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        json.dumps(
            {
                "benchmark": "capture_overhead",
                "requests": args.requests,
                "concurrency": args.concurrency,
                "latency_requests": args.latency_requests,
                "rounds": args.rounds,
                "worst_throughput_ratio": min(r["throughput_ratio"] for r in results.values()),
                "worst_cpu_ratio": min(r["cpu_ratio"] for r in results.values()),
                "worst_p99_added_ms": max(r["p99_added_ms"] for r in results.values()),
                "cpu_count": os.cpu_count(),
                "routes": results,
            }
        )
    )


if __name__ == "__main__":
    main()
