"""The ``claw`` command: one entry point for every process a user runs."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

Host = Annotated[str, typer.Option(help="Interface to bind; loopback unless told otherwise.")]


class Compat(StrEnum):
    claw_r1 = "claw-r1"


CompatOption = Annotated[
    Compat | None,
    typer.Option(
        help="Also serve another gateway's protocol: claw-r1 = Claw-R1's routes, model "
        "aliases and answer shape (docs/claw-r1.md)."
    ),
]


@app.command()
def sim(
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the embedded engine.")] = 8001,
    seed: Annotated[int, typer.Option(help="Seed of the simulated policy.")] = 0,
    log_file: Annotated[
        Path | None, typer.Option(help="Append every answer's token IDs here (JSONL).")
    ] = None,
    latency_ms: Annotated[
        float | None, typer.Option(help="Simulated generation time per answer.")
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Context window in tokens, prompt plus answer "
            "(default: $CLAW_ENGINE_MAX_MODEL_LEN, else 262144).",
        ),
    ] = None,
) -> None:
    """Run the embedded engine: a vLLM-shaped simulator (no GPU, not a real model)."""
    from claw_pipelines.engine.server import serve

    serve(host, port, seed, log_file, latency_ms, max_model_len)


@app.command()
def proxy(
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the LiteLLM proxy.")] = 4000,
    config: Annotated[
        Path | None,
        typer.Option(
            help="LiteLLM config (default: litellm.yaml of $CLAW_CONFIG_DIR, else the shipped "
            "resources/litellm.yaml)."
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(help="OpenAI-compatible base URL served as the default model."),
    ] = None,
    backend_model: Annotated[
        str | None,
        typer.Option(
            help="The model name the backend serves. Default: the first one its /models lists "
            "(the proxy refuses to start if it does not answer)."
        ),
    ] = None,
    num_workers: Annotated[int, typer.Option(help="Proxy worker processes.")] = 1,
    capture: Annotated[
        bool, typer.Option(help="--no-capture runs the plain LiteLLM proxy (for comparisons).")
    ] = True,
    compat: CompatOption = None,
) -> None:
    """Run the LiteLLM proxy with the capture callback (turns land in Delta)."""
    from claw_pipelines.edge.launcher import run_proxy

    run_proxy(
        host=host,
        port=port,
        config=config,
        backend=backend,
        backend_model=backend_model,
        num_workers=num_workers,
        capture=capture,
        compat=compat.value if compat else None,
    )


@app.command()
def inspect(
    host: Host = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the inspector.")] = 8120,
) -> None:
    """Run the trajectory inspector and curation UI."""
    from claw_pipelines.inspector.server import serve

    serve(host=host, port=port)


@app.command()
def up(
    host: Annotated[
        str,
        typer.Option(
            help="Interface the capture proxy binds; the other services stay on loopback."
        ),
    ] = "127.0.0.1",
    proxy_port: int = 4000,
    dagster_port: int = 3000,
    inspector_port: int = 8120,
    engine_port: int = 8001,
    compat: CompatOption = None,
    config_dir: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            envvar="CLAW_CONFIG_DIR",
            help="A folder whose batches.yaml, rewards.yaml, quality.yaml, litellm.yaml or "
            "dagster.yaml replace the shipped ones, file by file.",
        ),
    ] = None,
) -> None:
    """Start engine, proxy, Dagster and inspector on loopback; Ctrl-C stops them all."""
    if config_dir is not None:  # read by this process and the services it starts alike
        os.environ["CLAW_CONFIG_DIR"] = str(config_dir.absolute())
    from claw_pipelines.stack import run_stack

    run_stack(
        host=host,
        proxy_port=proxy_port,
        dagster_port=dagster_port,
        inspector_port=inspector_port,
        engine_port=engine_port,
        compat=compat.value if compat else None,
    )


@app.command()
def demo(
    prompts: Annotated[int, typer.Option(help="Distinct tasks (groups).")] = 8,
    rollouts: Annotated[int, typer.Option(help="Rollouts per task (group size).")] = 4,
    proxy_url: Annotated[
        str, typer.Option(help="Base URL of the capture proxy.", envvar="CLAW_PROXY_URL")
    ] = "http://127.0.0.1:4000",
    concurrency: Annotated[int, typer.Option(help="Rollouts in flight at once.")] = 8,
    online: Annotated[
        bool,
        typer.Option(
            help="Also play the trainer: take each GRPO batch, pause, announce version + 1, "
            "resume; rounds go on until it trained --train-steps batches."
        ),
    ] = False,
    train_steps: Annotated[int, typer.Option(help="With --online: batches to train on.")] = 6,
    train_s: Annotated[
        float, typer.Option(help="With --online: seconds one pretend training step takes.")
    ] = 2.0,
    online_timeout_s: Annotated[
        float, typer.Option(help="With --online: give up after this long without a batch.")
    ] = 300.0,
    long: Annotated[
        bool,
        typer.Option(
            help="Long sessions: a long system prompt and a tool call per file of a workspace "
            "(dozens per trajectory), the shape of real CLI agents and of sequence batches."
        ),
    ] = False,
    files: Annotated[int, typer.Option(help="With --long: files per workspace.")] = 30,
    system_tokens: Annotated[
        int, typer.Option(help="With --long: tokens of the system prompt.")
    ] = 27_000,
) -> None:
    """Drive a tool-using agent through the proxy: real traffic for the pipeline."""
    from claw_pipelines.demo import LongSessions, Online, run_demo

    summary = run_demo(
        prompts=prompts,
        rollouts=rollouts,
        proxy_url=proxy_url,
        concurrency=concurrency,
        online=Online(train_steps, online_timeout_s, train_s) if online else None,
        long=LongSessions(files, system_tokens) if long else None,
    )
    if summary.errors == summary.trajectories:
        raise typer.Exit(code=1)
    if summary.trainer is not None and summary.trainer.timed_out:
        typer.echo(
            f"no GRPO batch for {online_timeout_s:.0f} s: is Dagster running (claw up)?", err=True
        )
        raise typer.Exit(code=1)


batches = typer.Typer(
    no_args_is_help=True,
    help="Take exported batches from any trainer: wait for the next, ack it, list them.",
)
app.add_typer(batches, name="batches")

Recipe = Annotated[str, typer.Option("--recipe", help="The batch recipe (assets/batches.yaml).")]
Consumer = Annotated[
    str, typer.Option(help="The trainer's name: each name sees every batch, acks are its own.")
]
LakeUri = Annotated[
    str | None, typer.Option("--lake", help="Lake root (default: CLAW_LAKE_URI or .claw/lake).")
]


def _consumer(recipe: str, consumer: str, lake: str | None):
    from claw_pipelines.trainer import BatchConsumer

    return BatchConsumer(recipe, consumer=consumer, lake_uri=lake)


@batches.command("wait")
def batches_wait(
    recipe: Recipe,
    consumer: Consumer = "default",
    timeout: Annotated[
        float | None, typer.Option(help="Give up after this many seconds (exit code 2).")
    ] = None,
    lake: LakeUri = None,
) -> None:
    """Print the oldest exported batch this consumer has not acked, as JSON (batch_id, export
    folder, rows, manifest), waiting for one if need be."""
    import json

    batch = _consumer(recipe, consumer, lake).next(timeout_s=timeout)
    if batch is None:
        typer.echo(f"no unacked {recipe} batch within {timeout} s", err=True)
        raise typer.Exit(code=2)
    summary = {
        "batch_id": batch.batch_id,
        "export": batch.export_uri,
        "rows": batch.rows.height,
        "manifest": batch.manifest.model_dump(mode="json"),
    }
    typer.echo(json.dumps(summary))


@batches.command("ack")
def batches_ack(
    recipe: Recipe,
    batch: Annotated[str, typer.Option("--batch", help="The batch id `wait` printed.")],
    consumer: Consumer = "default",
    step: Annotated[int | None, typer.Option(help="The trainer step it was used in.")] = None,
    lake: LakeUri = None,
) -> None:
    """Record durably that this consumer trained on a batch."""
    try:
        _consumer(recipe, consumer, lake).ack(batch, trainer_step=step)
    except KeyError as error:
        typer.echo(str(error.args[0]), err=True)
        raise typer.Exit(code=1) from error


@batches.command("list")
def batches_list(recipe: Recipe, consumer: Consumer = "default", lake: LakeUri = None) -> None:
    """Every reserved batch, oldest first: exported, and acked by this consumer."""
    listed = _consumer(recipe, consumer, lake).batches()
    for row in listed.iter_rows(named=True):
        step = "" if row["trainer_step"] is None else f" step {row['trainer_step']}"
        state = "acked" + step if row["acked"] else "exported" if row["exported"] else "pending"
        typer.echo(f"{row['batch_id']}\t{row['planned_at']:%Y-%m-%dT%H:%M:%S}Z\t{state}")


if __name__ == "__main__":
    app()
