"""Capture overhead: the proxy with the capture callback vs the same proxy without it.

Same embedded engine, same request mix (non-streaming, return_token_ids + logprobs), same
concurrency, measured in one run. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from claw_pipelines.processes import Service, free_port, start_service
from claw_pipelines.stack import REPO_ROOT, start_engine, start_proxy


def baseline_config(workdir: Path) -> Path:
    """resources/litellm.yaml without the capture callback: the plain LiteLLM proxy."""
    config = yaml.safe_load((REPO_ROOT / "resources" / "litellm.yaml").read_text())
    config["litellm_settings"].pop("callbacks")
    for entry in config["model_list"]:
        entry.pop("model_info", None)
    path = workdir / "baseline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_baseline(port: int, workdir: Path, env: dict[str, str]) -> Service:
    litellm = str(Path(sys.executable).parent / "litellm")
    command = [litellm, "--config", str(baseline_config(workdir)), "--host", "127.0.0.1"]
    return start_service(
        "baseline-proxy",
        [*command, "--port", str(port)],
        f"http://127.0.0.1:{port}",
        workdir / "logs" / "baseline.log",
        env=env,
        cwd=workdir,
    )


async def drive(url: str, key: str, requests: int, concurrency: int) -> list[float]:
    """Send ``requests`` calls with ``concurrency`` in flight; return latencies in ms."""
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": "What is 12 + 30?"}],
        "max_tokens": 32,
        "logprobs": True,
        "return_token_ids": True,
    }
    latencies: list[float] = []
    queue = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60, limits=limits
    ) as client:

        async def worker() -> None:
            for _ in queue:
                start = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                latencies.append((time.perf_counter() - start) * 1000)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def measure(url: str, key: str, requests: int, concurrency: int) -> dict[str, float]:
    asyncio.run(drive(url, key, max(50, requests // 10), concurrency))
    start = time.perf_counter()
    latencies = asyncio.run(drive(url, key, requests, concurrency))
    elapsed = time.perf_counter() - start
    quantiles = statistics.quantiles(latencies, n=100)
    return {"rps": len(latencies) / elapsed, "p50_ms": quantiles[49], "p99_ms": quantiles[98]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per proxy")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="claw-bench-capture-"))
    key = "sk-bench-" + secrets.token_hex(16)
    env = {
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "CLAW_LAKE_URI": str(workdir / "lake"),
        "CLAW_SPOOL_DIR": str(workdir / "spool"),
        "CLAW_BACKEND_URL": "",
    }
    engine = start_engine(free_port(), workdir, env)
    services = [engine]
    try:
        engine.wait_ready("/health", timeout_s=60)
        env["CLAW_BACKEND_URL"] = f"{engine.url}/v1"
        capture = start_proxy(free_port(), workdir, env["CLAW_BACKEND_URL"], env)
        baseline = start_baseline(free_port(), workdir, env)
        services += [capture, baseline]
        capture.wait_ready("/health/liveliness", timeout_s=300)
        baseline.wait_ready("/health/liveliness", timeout_s=300)
        results: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
        for _ in range(args.rounds):
            results["without"].append(measure(baseline.url, key, args.requests, args.concurrency))
            results["with"].append(measure(capture.url, key, args.requests, args.concurrency))
    finally:
        for service in reversed(services):
            service.stop()

    def best(runs: list[dict[str, float]], metric: str, pick=max) -> float:
        return pick(run[metric] for run in runs)

    with_rps, without_rps = best(results["with"], "rps"), best(results["without"], "rps")
    with_p99 = best(results["with"], "p99_ms", min)
    without_p99 = best(results["without"], "p99_ms", min)
    print(
        json.dumps(
            {
                "benchmark": "capture_overhead",
                "requests": args.requests,
                "concurrency": args.concurrency,
                "rounds": args.rounds,
                "rps_with_capture": round(with_rps, 1),
                "rps_without_capture": round(without_rps, 1),
                "throughput_ratio": round(with_rps / without_rps, 3),
                "p50_ms_with": round(best(results["with"], "p50_ms", min), 2),
                "p50_ms_without": round(best(results["without"], "p50_ms", min), 2),
                "p99_ms_with": round(with_p99, 2),
                "p99_ms_without": round(without_p99, 2),
                "p99_added_ms": round(with_p99 - without_p99, 2),
                "cpu_count": os.cpu_count(),
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    main()
