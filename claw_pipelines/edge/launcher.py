"""``claw proxy``: start the real LiteLLM proxy (uvicorn) with capture, on loopback by default."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import uvicorn
import yaml
from pydantic import BaseModel, ValidationError

from claw_pipelines.access import key_refusal
from claw_pipelines.config_files import config_file, shipped_file
from claw_pipelines.edge.claw_r1.config import BIND_HOST_ENV, COMPAT_NAME, with_claw_r1
from claw_pipelines.edge.token_prompts import with_token_prompt_twins
from claw_pipelines.lake import Lake
from claw_pipelines.lake.store import LakeStoreError
from claw_pipelines.processes import probe_bind
from claw_pipelines.settings import LOCAL_MASTER_KEY, get_settings

DEFAULT_CONFIG = shipped_file("litellm.yaml")
DEFAULT_BACKEND = "http://127.0.0.1:8001/v1"
DEFAULT_MODEL_NAME = "policy"


class ProxyStartError(RuntimeError):
    """The proxy refuses to start; the message says why and what to do."""


def resolve_master_key(host: str, configured: str | None) -> str:
    """The proxy key: the configured one, or the documented local key on loopback only."""
    refusal = key_refusal(host, configured, "LITELLM_MASTER_KEY")
    if refusal is not None:
        raise ProxyStartError(refusal)
    return configured or LOCAL_MASTER_KEY


def check_port(host: str, port: int) -> None:
    """Fail before LiteLLM starts: its bind error comes after seconds of start-up output."""
    try:
        probe_bind(host, port)
    except OSError as error:
        raise ProxyStartError(
            f"cannot bind {host}:{port} ({error.strerror or error}); stop what holds it or "
            "pick another port with --port"
        ) from error


def check_lake_writable() -> None:
    """Fail at start, not in the background flusher while agents keep getting answers whose
    turns pile up in the spool: the lake of the settings must be configured for safe commits
    and its store must take them (``Lake.checked``)."""
    try:
        Lake.checked()
    except LakeStoreError as error:
        raise ProxyStartError(str(error)) from error


class _ModelCard(BaseModel):
    id: str


class _ModelList(BaseModel):
    """An OpenAI-compatible ``/models`` answer (only what the proxy needs of it)."""

    data: list[_ModelCard]


def served_model(backend: str) -> str:
    """The first model id an OpenAI-compatible backend serves (vLLM's served-model-name).

    A backend that does not tell is an error, not a default: the proxy would route agents to a
    model name the backend does not serve.
    """
    url = backend.rstrip("/") + "/models"
    advice = "start it first, or name its model with --backend-model"
    try:
        response = httpx.get(url, timeout=5.0)
        response.raise_for_status()
        models = _ModelList.model_validate_json(response.content).data
    except httpx.HTTPError as error:
        reason = str(error).splitlines()[0] or type(error).__name__
        raise ProxyStartError(f"backend {url} did not answer ({reason}); {advice}") from error
    except ValidationError as error:
        raise ProxyStartError(f"backend {url} answered no model list; {advice}") from error
    if not models:
        raise ProxyStartError(f"backend {url} lists no models; {advice}")
    return models[0].id


def render_config(
    source: Path,
    run_dir: Path,
    port: int,
    *,
    backend: str | None = None,
    model: str | None = None,
    capture: bool = True,
    compat: str | None = None,
) -> Path:
    """Write the config the proxy runs with: ``backend`` replaces the default model's server and
    ``model`` the name it is called by there; ``compat="claw-r1"`` switches Claw-R1's gateway
    protocol on (``claw_r1.config``). Each ``hosted_vllm/`` model gets its token-prompt twin
    (``token_prompts``).

    Without capture the callback is removed, leaving the plain LiteLLM proxy (for comparisons;
    it runs without the capture edge too, ``frozen_heap.plain_litellm``).
    Router cooldowns are off unless the config says otherwise: with one deployment per model, a
    single failing call would otherwise answer every agent 429 for seconds.
    """
    config = yaml.safe_load(source.read_text())
    config["router_settings"] = {"disable_cooldowns": True, **(config.get("router_settings") or {})}
    if not capture:
        (config.get("litellm_settings") or {}).pop("callbacks", None)
    for entry in config.get("model_list") or []:
        if entry.get("model_name") == DEFAULT_MODEL_NAME:
            if backend:
                entry["litellm_params"]["api_base"] = backend
            if model:
                entry["litellm_params"]["model"] = f"hosted_vllm/{model}"
    config = with_token_prompt_twins(with_claw_r1(config, enable=compat == COMPAT_NAME))
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / f"litellm-{port}.yaml"
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def run_proxy(
    host: str,
    port: int,
    config: Path | None,
    backend: str | None,
    num_workers: int,
    capture: bool = True,
    backend_model: str | None = None,
    compat: str | None = None,
) -> None:
    """Check what the proxy needs, then run it; a failed check exits with one line."""
    try:
        key = resolve_master_key(host, os.environ.get("LITELLM_MASTER_KEY"))
        check_port(host, port)
        if capture:
            check_lake_writable()
        model = backend_model or (served_model(backend) if backend else None)
    except ProxyStartError as error:
        raise SystemExit(f"claw proxy: {error}") from error
    source = config or config_file("litellm.yaml")
    try:
        config_path = render_config(
            source,
            get_settings().run_dir.absolute(),
            port,
            backend=backend,
            model=model,
            capture=capture,
            compat=compat,
        )
    except ValueError as error:  # a compat block that does not fit the config
        raise SystemExit(f"claw proxy: {source}: {error}") from error
    os.environ.update(
        {
            BIND_HOST_ENV: host,
            "LITELLM_MASTER_KEY": key,
            "CONFIG_FILE_PATH": str(config_path),
            "CLAW_BACKEND_URL": backend or os.environ.get("CLAW_BACKEND_URL", DEFAULT_BACKEND),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
        }
    )
    print(
        f"claw proxy: http://{host}:{port}  (config {config_path}, workers {num_workers})",
        flush=True,
    )
    uvicorn.run(
        "claw_pipelines.edge.asgi:app"
        if capture
        else "claw_pipelines.edge.frozen_heap:plain_litellm",
        host=host,
        port=port,
        workers=num_workers,
        access_log=False,
        log_level="warning",
        timeout_keep_alive=get_settings().proxy_keep_alive_s,
        timeout_graceful_shutdown=20,
        factory=not capture,
    )
