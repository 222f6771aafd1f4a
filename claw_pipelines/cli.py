"""The ``claw`` command: one entry point for every process a user runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

Host = Annotated[str, typer.Option(help="Interface to bind; loopback unless told otherwise.")]


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
        Path | None, typer.Option(help="LiteLLM config (default: resources/litellm.yaml).")
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
) -> None:
    """Run the LiteLLM proxy with the capture callback (turns land in Delta)."""
    from claw_pipelines.capture.launcher import run_proxy

    run_proxy(
        host=host,
        port=port,
        config=config,
        backend=backend,
        backend_model=backend_model,
        num_workers=num_workers,
        capture=capture,
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
) -> None:
    """Start engine, proxy, Dagster and inspector on loopback; Ctrl-C stops them all."""
    from claw_pipelines.stack import run_stack

    run_stack(
        host=host,
        proxy_port=proxy_port,
        dagster_port=dagster_port,
        inspector_port=inspector_port,
        engine_port=engine_port,
    )


@app.command()
def demo(
    prompts: Annotated[int, typer.Option(help="Distinct tasks (groups).")] = 8,
    rollouts: Annotated[int, typer.Option(help="Rollouts per task (group size).")] = 4,
    proxy_url: Annotated[str, typer.Option(help="Base URL of the capture proxy.")] = (
        "http://127.0.0.1:4000"
    ),
    concurrency: Annotated[int, typer.Option(help="Rollouts in flight at once.")] = 8,
) -> None:
    """Drive a tool-using agent through the proxy: real traffic for the pipeline."""
    from claw_pipelines.demo import run_demo

    summary = run_demo(
        prompts=prompts, rollouts=rollouts, proxy_url=proxy_url, concurrency=concurrency
    )
    if summary.errors == summary.trajectories:
        raise typer.Exit(code=1)


if __name__ == "__main__":
    app()
