"""Landing throughput: spool segments -> Delta ``turns`` vs a bare ``write_deltalake``.

Both sides write the same rows (1,024 prompt + 256 response tokens with logprobs) in the same
batch size in one run; the spool side includes parsing the segments, app transactions, the
idempotency check and segment deletion. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from deltalake import CommitProperties, WriterProperties, write_deltalake

from claw_pipelines.lake import Lake
from claw_pipelines.lake.properties import landing_writer, table_configuration
from claw_pipelines.schemas import Turn, rows_to_arrow, utc_now
from claw_pipelines.spool.flusher import SpoolFlusher
from claw_pipelines.spool.writer import SpoolWriter


def synthetic_batches(
    count: int, batch: int, prompt_len: int, response_len: int, seed: int = 0
) -> Iterator[list[Turn]]:
    """The same ``count`` rows on every call, ``batch`` at a time.

    Made batch by batch so the bench holds no more rows than a proxy does between flushes: all
    8,192 default rows at once are 10M Python ints, and a full garbage collection over them (a
    tenth of a second) would land in whichever side's timed stretch happened to trigger it.
    """
    rng = np.random.default_rng(seed)
    now = utc_now()
    for start in range(0, count, batch):
        size = min(batch, count - start)
        prompts = rng.integers(50_000, size=(size, prompt_len), dtype=np.int32).tolist()
        responses = rng.integers(50_000, size=(size, response_len), dtype=np.int32).tolist()
        logprobs = (-rng.random((size, response_len), dtype=np.float32)).tolist()
        yield [
            Turn(
                turn_id=f"turn-{i:08d}",
                trajectory_id=f"traj-{i // 4:07d}",
                group_id=f"group-{i // 16:06d}",
                model="policy",
                token_source="engine",
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=logprob,
                request_messages=json.dumps([{"role": "user", "content": f"task {i}"}]),
                response_message=json.dumps({"role": "assistant", "content": f"answer {i}"}),
                response_text=f"answer {i}",
                started_at=now,
                ended_at=now,
            )
            for i, prompt, response, logprob in zip(
                range(start, start + size), prompts, responses, logprobs, strict=True
            )
        ]


def spool_to_delta(batches: Iterable[list[Turn]], batch: int, workdir: Path) -> float:
    """Seconds the flusher spends committing segments of ``batch`` rows, one commit each.

    Appending to the spool happens on the request path and is measured by capture_overhead.
    """
    lake = Lake(str(workdir / "spool-lake"))
    writer = SpoolWriter(workdir / "spool")
    flusher = SpoolFlusher(writer, lake, max_rows=batch)
    elapsed = 0.0
    appended = committed = 0
    for turns in batches:
        for turn in turns:
            writer.append(turn)
        appended += len(turns)
        del turns
        began = time.perf_counter()
        committed += flusher.flush()
        elapsed += time.perf_counter() - began
    assert committed == appended, (committed, appended)
    return elapsed


def bare_writes(
    batches: Iterable[list[Turn]],
    workdir: Path,
    name: str = "bare-lake",
    writer_properties: WriterProperties | None = None,
) -> float:
    """Seconds for plain ``write_deltalake`` appends of the same rows and batch size to a table
    with the landing table's properties; with ``writer_properties``, Parquet written as the
    proxy writes it (``lake.landing_writer``), so only the spool's own work differs."""
    uri = str(workdir / name / "turns")
    tables = [rows_to_arrow(Turn, [t.model_dump() for t in turns]) for turns in batches]
    began = time.perf_counter()
    for table in tables:
        write_deltalake(
            uri,
            table,
            mode="append",
            configuration=table_configuration("turns"),
            commit_properties=CommitProperties(max_commit_retries=100),
            writer_properties=writer_properties,
        )
    return time.perf_counter() - began


QUICK = {"turns": 256, "batch": 64}
"""``--quick``: every path at a tiny size, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--response-tokens", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    shape = (args.turns, args.batch, args.prompt_tokens, args.response_tokens)
    with tempfile.TemporaryDirectory(prefix="claw-bench-landing-") as folder:
        workdir = Path(folder)
        bare_s = bare_writes(synthetic_batches(*shape), workdir)
        tuned = landing_writer("turns")
        tuned_s = bare_writes(synthetic_batches(*shape), workdir, "tuned-lake", tuned)
        spool_s = spool_to_delta(synthetic_batches(*shape), args.batch, workdir)
    print(
        json.dumps(
            {
                "benchmark": "landing_throughput",
                "turns": args.turns,
                "batch": args.batch,
                "prompt_tokens": args.prompt_tokens,
                "response_tokens": args.response_tokens,
                "turns_per_s": round(args.turns / spool_s, 1),
                "bare_turns_per_s": round(args.turns / bare_s, 1),
                "ratio_vs_bare": round(bare_s / spool_s, 3),
                "tuned_bare_turns_per_s": round(args.turns / tuned_s, 1),
                "ratio_vs_tuned_bare": round(tuned_s / spool_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
