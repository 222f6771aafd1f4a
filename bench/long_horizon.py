"""Long-horizon agent sessions: what landing, the build and a GRPO export cost per trajectory.

Real CLI agents make tens to hundreds of calls per session, each call's prompt the previous
prompt + its reply + the tool's output (issue 33). This bench makes such sessions and lands
every call through capture's own code: the LiteLLM hooks of ``capture_logger`` (the callback
``claw proxy`` registers) run as LiteLLM's proxy runs them, the pre-call hook on a chat request
with the identity headers, the success hook on the engine's answer (prompt and reply token IDs,
logprobs, as vLLM returns them), so the row is built, stored as capture stores it, spooled and
committed by the ``CaptureRuntime``'s flusher, as in a proxy worker. Each
trajectory then completes with a reward (alternating within its group of 4). Then, in a fresh
process, one refresh run as the ingest sensor launches it (``bench/pipeline.py``'s
``phase_pipeline``: steps -> ... -> curated_steps, then ``release_grpo`` exporting the batch for
TRL), with the shipped ``grpo`` recipe taking every group and its length filters lifted so the
sessions are in the batch (the shipped ones are reported).

Shapes (full size): ``tools_30x8k``, 64 trajectories x 30 calls, 8,192-token first prompt,
256-token replies, 500-token tool outputs; ``codex_100x27k``, 16 trajectories x 100 calls,
27,000-token first prompt (a Codex-like system prompt and tools), the same replies and outputs.
Messages hold about ``CHARS_PER_TOKEN`` characters per token of repository text; token IDs
are random, and every prompt is exactly the previous sequence extended (prefix-consistent).

Prints one JSON object. Goals (issue 33 item 7), over both shapes (the worst):
``forwarded_token_ratio`` = tokens of the GRPO export (TRL ``prompt_ids`` + ``completion_ids``
of every row: nothing is padded there) / tokens of the trajectories' sequences (first prompt +
every reply + every tool output) <= 1.02; ``stored_bytes_ratio`` = bytes of every file under
the lake root (landing tables, derived tables, Delta logs, exports) / bytes of the same
trajectories' last calls alone landed by a fresh capture runtime (which has seen no earlier
call, so it stores each whole), in uncompressed Parquet as ``turns`` stored a row when the goal
was set (the lake is zstd-compressed since; ``stored_bytes_ratio_lake_codec`` divides by those
rows in the lake's own codec) <= 2; ``build_peak_rss_bytes`` = peak RSS of the build process
at 256 trajectories x 100 calls x 27k (full size only; the build is stopped past
``--rss-cap-gib`` and the figure then is that cap, flagged) <= 2 GiB; ``capture_cpu_ratio`` =
CPU per call of ``claw proxy --no-capture`` / that of the capturing proxy at a ~50k-token chat
prompt whose agent asks for the token IDs and logprobs (both proxies then hand them out), with
``bench/capture_overhead.py``'s machinery >= 0.95; ``capture_cpu_ratio_plain_agent`` the same
for the request as agents send it, asking for neither (only the capturing proxy's engine
computes them, and its proxy reads them). Per shape it also reports the
tokens ``turns`` stores against the sequences' tokens, each table's bytes and the phases'
seconds and peak RSS; ``load_average`` too (the machine is shared).

    .venv/bin/python bench/long_horizon.py [--quick] [--skip-rss] [--skip-capture]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import capture_overhead as overhead
import numpy as np
import polars as pl
import psutil
from deltalake import DeltaTable
from engine_long_prompt import agent_request, corpus
from pipeline import GROUP_SIZE, peak_rss_mib, phase_pipeline, run_phase
from pydantic import BaseModel

from claw_pipelines.schemas import TrajectoryEventRow

VOCAB = 150_000
CHARS_PER_TOKEN = 4
"""Characters of message text per token (BPE tokenizers average 3.5-4.5 on English and code)."""
GIB = 2**30
SHELL_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                "required": ["command"],
            },
        },
    }
    for name, description in [
        ("shell", "Runs a shell command and returns its output."),
        ("apply_patch", "Applies a patch to files in the workspace."),
        ("update_plan", "Updates the task plan."),
    ]
]
"""Codex CLI's tools, by name (their schemas shortened: the first prompt's size is set apart)."""


class Shape(BaseModel):
    """One kind of session: how many, how long, and the size of each part of a call."""

    name: str
    trajectories: int
    calls: int
    first_prompt: int
    reply: int
    observation: int

    def prompt_len(self, call: int) -> int:
        """Tokens of call ``call``'s prompt: the first prompt and every earlier exchange."""
        return self.first_prompt + call * (self.reply + self.observation)

    @property
    def sequence_tokens(self) -> int:
        """Tokens of one trajectory as one sequence: its last prompt and last reply."""
        return self.prompt_len(self.calls - 1) + self.reply


FULL = [
    Shape(
        name="tools_30x8k", trajectories=64, calls=30, first_prompt=8192, reply=256, observation=500
    ),
    Shape(
        name="codex_100x27k",
        trajectories=16,
        calls=100,
        first_prompt=27_000,
        reply=256,
        observation=500,
    ),
]
QUICK = [
    Shape(
        name="codex_100x27k", trajectories=4, calls=6, first_prompt=512, reply=16, observation=24
    ),
]
"""One tiny shape: every phase starts a process (LiteLLM, Dagster imports), and one shape
goes through the whole path."""
RSS_SHAPE = Shape(
    name="codex_100x27k_x256",
    trajectories=256,
    calls=100,
    first_prompt=27_000,
    reply=256,
    observation=500,
)
RSS_LAND_WORKERS = 2
"""Processes landing the 256 sessions (a two-worker proxy): landing is not what is measured."""
CAPTURE_PROMPT_CHARS = {"full": 59_000, "quick": 2_000}
"""Characters of the capture comparison's request: ~50k tokens of the embedded engine's
tokenizer at full size (the bench reports the count the engine returned)."""
AGENT_REQUEST_CHARS = 48_000
"""From this size on the request is ``agent_request``'s (system prompt, 16 tools, history)."""
CAPTURE_RUNS = {
    "full": {"requests": 60, "rounds": 4, "concurrency": 4, "latency_requests": 20, "warm_up": 10},
    "quick": {"requests": 4, "rounds": 1, "concurrency": 2, "latency_requests": 4, "warm_up": 2},
}
CAPTURE_ROUTE = "chat_long"


def _passage(text: str, start: int, tokens: int) -> str:
    """About ``tokens`` tokens of ``text`` from ``start`` on (wrapping)."""
    chars = tokens * CHARS_PER_TOKEN
    begin = start % max(1, len(text) - chars)
    return text[begin : begin + chars]


def session(shape: Shape, index: int, text: str) -> Iterator[tuple[int, dict, dict]]:
    """Each call of trajectory ``index``: (call, chat request, engine answer as vLLM returns it)."""
    rng = np.random.default_rng(index)
    sequence = rng.integers(1, VOCAB, shape.sequence_tokens, dtype=np.int32)
    logprobs = -rng.random(shape.calls * shape.reply, dtype=np.float32)
    messages = [
        {"role": "system", "content": _passage(text, index * 7919, shape.first_prompt - 64)},
        {"role": "user", "content": _passage(text, index * 104_729, 64)},
    ]
    for call in range(shape.calls):
        start = shape.prompt_len(call)
        last = call == shape.calls - 1
        reply = {"role": "assistant", "content": _passage(text, start, shape.reply)}
        if not last:
            arguments = json.dumps({"command": ["bash", "-lc", f"sed -n {call},+40p src/lib.rs"]})
            reply["tool_calls"] = [
                {
                    "id": f"call_{call}",
                    "type": "function",
                    "function": {"name": "shell", "arguments": arguments},
                }
            ]
        request = {
            "model": "policy",
            "messages": messages,
            "tools": SHELL_TOOLS,
            "max_tokens": 4096,
            "logprobs": True,
            "return_token_ids": True,
        }
        chosen = logprobs[call * shape.reply : (call + 1) * shape.reply]
        answer = {
            "model": "policy",
            "prompt_token_ids": sequence[:start].tolist(),
            "choices": [
                {
                    "index": 0,
                    "message": reply,
                    "finish_reason": "stop" if last else "tool_calls",
                    "token_ids": sequence[start : start + shape.reply].tolist(),
                    "logprobs": {"content": [{"logprob": v} for v in chosen.tolist()]},
                }
            ],
            "usage": {"prompt_tokens": start, "completion_tokens": shape.reply},
        }
        yield call, request, answer
        output = _passage(text, start + shape.reply, shape.observation)
        messages = [
            *messages,
            reply,
            {"role": "tool", "tool_call_id": f"call_{call}", "content": output},
        ]


async def _land_sessions(shape: Shape, last_only: bool, worker: int, workers: int) -> int:
    """Each call through capture's LiteLLM hooks, as the proxy runs them: the pre-call hook
    (identity from the headers, the pending call), then the success hook with the engine's
    answer (the row built, compacted against the trajectory's previous call, spooled)."""
    from claw_pipelines.capture.callback import capture_logger

    text, calls = corpus(), 0
    for index in range(worker, shape.trajectories, workers):
        trajectory = f"{shape.name}-t{index:04d}"
        group = f"{shape.name}-g{index // GROUP_SIZE:04d}"
        headers = {
            "x-claw-trajectory": trajectory,
            "x-claw-group": group,
            "x-claw-policy-version": "1",
        }
        for call, request, answer in session(shape, index, text):
            if last_only and call < shape.calls - 1:
                continue
            data = {
                **request,
                "litellm_call_id": f"{trajectory}-c{call:03d}",
                "proxy_server_request": {"headers": headers},
            }
            await capture_logger.async_pre_call_hook(None, None, data, "acompletion")
            await capture_logger.async_post_call_success_hook(data, None, answer)
            calls += 1
        if not last_only:
            event = TrajectoryEventRow(
                trajectory_id=trajectory, group_id=group, reward=float(index % 2)
            )
            await capture_logger.runtime.land_durably([event])
    return calls


def phase_land(
    shape: Shape, last_only: bool, worker: int, workers: int, uncompressed: bool = False
) -> dict:
    """Land the shape's sessions (lake and spool from ``CLAW_*``): every call and a completion
    with a reward per trajectory, or with ``last_only`` each trajectory's last call alone (the
    reference a full row is measured by), then commit what the spool holds. ``uncompressed``:
    in uncompressed Parquet files, as ``turns`` stored a row when issue 33 set its goal."""
    from claw_pipelines.capture.runtime import CaptureRuntime
    from claw_pipelines.lake import properties

    if uncompressed:
        properties.COMPRESSION, properties.COMPRESSION_LEVEL = "UNCOMPRESSED", None

    started = time.perf_counter()
    calls = asyncio.run(_land_sessions(shape, last_only, worker, workers))
    CaptureRuntime.shutdown_current()
    return {"seconds": round(time.perf_counter() - started, 2), "calls": calls}


def phase_build(lake_root: str, groups: int) -> dict:
    """One refresh run and the GRPO release (``pipeline.phase_pipeline``), the recipe's length
    filters lifted: what is measured is the cost of sessions in a batch, not their exclusion."""
    from claw_pipelines import config_files
    from claw_pipelines.lake import Lake

    recipe = config_files.recipes()["grpo"]
    lifted = recipe.filters.model_copy(update={"max_prompt_len": None, "max_response_len": None})
    config_files.recipes()["grpo"] = recipe.model_copy(update={"filters": lifted})
    return phase_pipeline(Lake(lake_root), groups)


def run_capped(args: list[str], cap_bytes: int) -> dict:
    """``run_phase`` with a watch on the child's RSS: past ``cap_bytes`` it is stopped (the
    machine is shared) and the result says so instead of the phase's own."""
    child = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    watched, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        if peak > cap_bytes:
            os.killpg(child.pid, 9)
            child.wait()
            return {"ok": False, "exceeded_cap": True, "peak_rss_mib": peak / 2**20}
        time.sleep(0.2)
    out, err = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"phase {args} failed:\n{err[-4000:]}")
    return {**json.loads(out.strip().splitlines()[-1]), "exceeded_cap": False}


def _phase_env(root: Path, worker: int) -> dict[str, str]:
    return {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "CLAW_LAKE_URI": str(root / "lake"),
        "CLAW_SPOOL_DIR": str(root / f"spool-{worker}"),
    }


def land(
    shape: Shape, root: Path, last_only: bool = False, workers: int = 1, uncompressed: bool = False
) -> dict:
    """``phase_land`` in ``workers`` fresh processes (as a proxy's workers, each with its own
    spool, a trajectory on one of them) whose capture runtimes write the lake under ``root``."""
    args = ["--phase", "land", "--shape", shape.model_dump_json(), "--workers", str(workers)]
    args += ["--uncompressed"] if uncompressed else []
    started = time.perf_counter()
    children = [
        subprocess.Popen(
            [sys.executable, __file__, *args, "--worker", str(worker)]
            + (["--last-only"] if last_only else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_phase_env(root, worker),
        )
        for worker in range(workers)
    ]
    landed = []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"landing {shape.name} failed:\n{err[-4000:]}")
        landed.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "calls": sum(one["calls"] for one in landed),
        "workers": workers,
        "peak_rss_mib": max(one["peak_rss_mib"] for one in landed),
    }


def tree_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def data_bytes(table: Path) -> int:
    """Bytes of a Delta table's current data files (its rows, without the log)."""
    return sum(
        Path(uri.removeprefix("file://")).stat().st_size
        for uri in DeltaTable(str(table)).file_uris()
    )


def table_bytes(lake: Path) -> dict[str, int]:
    """Bytes on disk of each table folder and export folder of the lake (``exports/<recipe>``)."""
    folders = [p for p in lake.iterdir() if p.is_dir() and p.name != "exports"]
    exports = [p for p in (lake / "exports").glob("*") if p.is_dir()]
    return {str(p.relative_to(lake)): tree_bytes(p) for p in sorted([*folders, *exports])}


def stored_tokens(lake: Path) -> int:
    """Token IDs the ``turns`` table holds (prompt and reply lists as stored)."""
    lengths = [pl.col(c).list.len().sum() for c in ("prompt_token_ids", "response_token_ids")]
    row = pl.scan_delta(str(lake / "turns")).select(pl.sum_horizontal(lengths)).collect()
    return int(row.item())


def forwarded(lake: Path) -> dict[str, int]:
    """Tokens and trajectories of the GRPO export's TRL rollouts: what a trainer forwards."""
    files = sorted(str(p) for p in (lake / "exports" / "grpo").rglob("rollouts*.parquet"))
    if not files:
        return {"tokens": 0, "trajectories": 0, "rows": 0, "rows_without_tokens": 0}
    rows = pl.scan_parquet(files).select(
        (pl.col("prompt_ids").list.len() + pl.col("completion_ids").list.len())
        .sum()
        .alias("tokens"),
        pl.col("trajectory_id").n_unique().alias("trajectories"),
        pl.len().alias("rows"),
        pl.col("prompt_ids").is_null().sum().alias("rows_without_tokens"),
    )
    return {name: int(value) for name, value in rows.collect().row(0, named=True).items()}


def measure_shape(shape: Shape, workdir: Path) -> dict:
    """Land, build and measure one shape (every phase in its own process)."""
    root = workdir / shape.name
    landed = land(shape, root)
    reference = land(shape, workdir / f"{shape.name}-last-rows", last_only=True, uncompressed=True)
    land(shape, workdir / f"{shape.name}-last-rows-lake-codec", last_only=True)
    lake = root / "lake"
    build = run_phase(
        [
            "--phase",
            "build",
            "--lake",
            str(lake),
            "--groups",
            str(shape.trajectories // GROUP_SIZE),
        ],
        __file__,
    )
    last_rows_bytes = data_bytes(workdir / f"{shape.name}-last-rows" / "lake" / "turns")
    same_codec_bytes = data_bytes(workdir / f"{shape.name}-last-rows-lake-codec" / "lake" / "turns")
    exported = forwarded(lake)
    sequence_tokens = shape.trajectories * shape.sequence_tokens
    per_trajectory = sequence_tokens / shape.trajectories
    lake_bytes = tree_bytes(lake)
    turns_tokens = stored_tokens(lake)
    return {
        "shape": shape.model_dump(),
        "sequence_tokens": sequence_tokens,
        "turns_tokens": turns_tokens,
        "turns_tokens_ratio": round(turns_tokens / sequence_tokens, 3),
        "export_tokens": exported["tokens"],
        "export_rows": exported["rows"],
        "export_trajectories": exported["trajectories"],
        "export_rows_without_tokens": exported["rows_without_tokens"],
        "forwarded_token_ratio": round(
            exported["tokens"] / (exported["trajectories"] * per_trajectory), 4
        )
        if exported["trajectories"]
        else None,
        "lake_bytes": lake_bytes,
        "last_rows_bytes": last_rows_bytes,
        "stored_bytes_ratio": round(lake_bytes / last_rows_bytes, 3),
        "last_rows_bytes_lake_codec": same_codec_bytes,
        "stored_bytes_ratio_lake_codec": round(lake_bytes / same_codec_bytes, 3),
        "sequence_int32_bytes": sequence_tokens * 4,
        "table_bytes": table_bytes(lake),
        "land_seconds": landed["seconds"],
        "land_calls": landed["calls"],
        "reference_calls": reference["calls"],
        "build_seconds": round(build["seconds"], 2),
        "build_ok": build["ok"],
        "build_batch_rows": build["batch_rows"],
        "build_peak_rss_mib": build["peak_rss_mib"],
    }


def measure_rss(workdir: Path, cap_bytes: int) -> dict:
    """The build's peak RSS at ``RSS_SHAPE``, landed as the other shapes are."""
    root = workdir / RSS_SHAPE.name
    landed = land(RSS_SHAPE, root, workers=RSS_LAND_WORKERS)
    groups = str(RSS_SHAPE.trajectories // GROUP_SIZE)
    build = run_capped(
        ["--phase", "build", "--lake", str(root / "lake"), "--groups", groups], cap_bytes
    )
    return {
        "shape": RSS_SHAPE.model_dump(),
        "land_seconds": landed["seconds"],
        "lake_bytes_before_build": tree_bytes(root / "lake" / "turns"),
        "build": build,
        "peak_rss_bytes": int(build["peak_rss_mib"] * 2**20),
    }


def long_request(chars: int) -> dict:
    """A chat request of about ``chars`` characters of repository text: Claude-Code-shaped
    (``agent_request``) when long enough for that shape, else one user message."""
    if chars >= AGENT_REQUEST_CHARS:
        return agent_request(chars)
    return {"messages": [{"role": "user", "content": corpus()[:chars]}]}


def capture_requests(size: str) -> dict[str, dict]:
    """The capture comparison's two requests on one long chat prompt (``agent_request``):
    ``asking`` asks for the engine's token IDs and logprobs itself (so both proxies serialize
    them to the agent: like for like), ``plain`` as agents send it, asking for neither (the
    capturing proxy still asks the engine for both; the bare proxy's engine computes neither).
    Both carry a sampling ``seed``, so every call gets the same reply from the engine through
    either proxy (vLLM's per-request seed): without it the replies' lengths vary from call to
    call (16 or 32 tokens) and with them each proxy's work."""
    body = long_request(CAPTURE_PROMPT_CHARS[size])
    body.update(model="policy", max_tokens=32, seed=0)
    plain = {k: v for k, v in body.items() if k not in ("logprobs", "return_token_ids")}
    return {"asking": {**plain, "logprobs": True, "return_token_ids": True}, "plain": plain}


def capture_cpu(size: str) -> dict:
    """``capture_overhead``'s CPU per call, capturing proxy against ``--no-capture``, on each of
    ``capture_requests``, in rounds with who goes first alternating."""

    import httpx

    from claw_pipelines.processes import free_port
    from claw_pipelines.stack import start_engine, start_proxy

    runs = CAPTURE_RUNS[size]
    bodies = capture_requests(size)
    for name, body in bodies.items():
        overhead.ROUTES[f"{CAPTURE_ROUTE}_{name}"] = ("/v1/chat/completions", body)
    workdir = Path(tempfile.mkdtemp(prefix="claw-bench-long-capture-"))
    key, env = overhead.stack_env(workdir)
    services = [start_engine(free_port(), workdir, env)]
    try:
        engine = services[0]
        engine.wait_ready("/health", timeout_s=60)
        prompt_tokens = httpx.post(
            f"{engine.url}/v1/chat/completions", json=bodies["plain"], timeout=120
        ).json()["usage"]["prompt_tokens"]
        (workdir / "plain").mkdir()
        proxies = {
            "with": start_proxy(free_port(), workdir, f"{engine.url}/v1", env),
            "without": start_proxy(
                free_port(),
                workdir / "plain",
                f"{engine.url}/v1",
                env,
                capture=False,
                config=overhead.bare_config(workdir),
            ),
        }
        services += proxies.values()
        routes = [f"{CAPTURE_ROUTE}_{name}" for name in bodies]
        for proxy in proxies.values():
            proxy.wait_ready("/health/liveliness", timeout_s=300)
            for route in routes:
                asyncio.run(
                    overhead.drive(proxy.url, key, route, runs["warm_up"], runs["concurrency"])
                )
        time.sleep(overhead.FIRST_COMMIT_WAIT_S)
        summaries = {
            name: overhead.measure_route(
                proxies,
                key,
                route,
                runs["rounds"],
                runs["requests"],
                runs["concurrency"],
                runs["latency_requests"],
            )
            for name, route in zip(bodies, routes, strict=True)
        }
    finally:
        for service in reversed(services):
            service.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    kept = {name: {k: summary[k] for k in CAPTURE_KEYS} for name, summary in summaries.items()}
    return {"prompt_tokens": prompt_tokens, **runs, **kept}


CAPTURE_KEYS = (
    "cpu_ratio",
    "cpu_ms_per_call_with",
    "cpu_ms_per_call_without",
    "throughput_ratio",
    "p50_added_ms",
    "p99_added_ms",
)


def progress(measured: dict) -> dict:
    """``measured``, also written to stderr at once: a long run's parts outlive a failed end."""
    print(json.dumps(measured), file=sys.stderr, flush=True)
    return measured


def _worst(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, the whole path")
    parser.add_argument("--skip-rss", action="store_true", help="no 256-trajectory build")
    parser.add_argument("--skip-capture", action="store_true", help="no proxy CPU comparison")
    parser.add_argument("--rss-cap-gib", type=float, default=8.0)
    parser.add_argument("--phase", choices=["land", "build"], help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--last-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--uncompressed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        if args.phase == "land":
            shape = Shape.model_validate_json(args.shape)
            measured = phase_land(
                shape, args.last_only, args.worker, args.workers, args.uncompressed
            )
        else:
            measured = phase_build(args.lake, args.groups)
        print(json.dumps({**measured, "peak_rss_mib": round(peak_rss_mib(), 1)}))
        return

    size = "quick" if args.quick else "full"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="claw-bench-long-") as workdir:
        shapes = {}
        for shape in QUICK if args.quick else FULL:
            shapes[shape.name] = progress(measure_shape(shape, Path(workdir)))
        rss = None
        if not (args.quick or args.skip_rss):
            rss = progress(measure_rss(Path(workdir), int(args.rss_cap_gib * GIB)))
    capture = None if args.skip_capture else capture_cpu(size)
    from claw_pipelines import config_files

    shipped = config_files.recipes()["grpo"].filters
    peak = rss["peak_rss_bytes"] if rss else None
    print(
        json.dumps(
            {
                "benchmark": "long_horizon",
                "size": size,
                "forwarded_token_ratio": _worst(
                    [s["forwarded_token_ratio"] for s in shapes.values()]
                ),
                "stored_bytes_ratio": _worst([s["stored_bytes_ratio"] for s in shapes.values()]),
                "stored_bytes_ratio_lake_codec": _worst(
                    [s["stored_bytes_ratio_lake_codec"] for s in shapes.values()]
                ),
                "build_peak_rss_bytes": peak,
                "build_peak_rss_gib": round(peak / GIB, 3) if peak else None,
                "build_rss_exceeded_cap": rss["build"]["exceeded_cap"] if rss else None,
                "capture_cpu_ratio": capture["asking"]["cpu_ratio"] if capture else None,
                "capture_cpu_ratio_plain_agent": capture["plain"]["cpu_ratio"] if capture else None,
                "goals": {
                    "forwarded_token_ratio": 1.02,
                    "stored_bytes_ratio": 2,
                    "build_peak_rss_gib": 2,
                    "capture_cpu_ratio": 0.95,
                },
                "shipped_grpo_max_prompt_len": shipped.max_prompt_len,
                "shapes": shapes,
                "rss": rss,
                "capture": capture,
                "seconds": round(time.perf_counter() - started, 1),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
