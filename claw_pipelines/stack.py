"""``claw up``: engine, capture proxy, Dagster and inspector on loopback, stopped together.

The same start functions serve the tests and benchmarks, so what they exercise is what a user
runs. Every service is its own process group; stopping kills the group (Dagster's ``dev`` can
hang on SIGTERM, so it is killed after a grace period).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from claw_pipelines.batches.recipe import load_recipes
from claw_pipelines.config_files import config_file
from claw_pipelines.lake import Lake
from claw_pipelines.lake.store import LakeStoreError
from claw_pipelines.processes import Service, ServiceStartError, probe_bind, start_service
from claw_pipelines.settings import LOCAL_MASTER_KEY, ClawSettings, get_settings

CLI = [sys.executable, "-m", "claw_pipelines.cli"]
CODE_LOCATION = {"module_name": "assets.definitions", "location_name": "claw_pipelines"}
"""The code location Dagster loads from the installed packages (as the repository's
workspace.yaml does from the checkout)."""


def start_engine(port: int, workdir: Path, env: dict[str, str] | None = None) -> Service:
    log_file = workdir / "engine-answers.jsonl"
    return start_service(
        "engine",
        [*CLI, "sim", "--port", str(port), "--log-file", str(log_file)],
        f"http://127.0.0.1:{port}",
        workdir / "logs" / "engine.log",
        env=env,
        cwd=workdir,
    )


def start_proxy(
    port: int,
    workdir: Path,
    backend: str,
    env: dict[str, str] | None = None,
    num_workers: int = 1,
    host: str = "127.0.0.1",
    capture: bool = True,
    config: Path | None = None,
    compat: str | None = None,
) -> Service:
    command = [*CLI, "proxy", "--host", host, "--port", str(port), "--backend", backend]
    command += ["--num-workers", str(num_workers), "--capture" if capture else "--no-capture"]
    command += ["--config", str(config)] if config else []
    command += ["--compat", compat] if compat else []
    return start_service(
        "proxy" if capture else "plain-proxy",
        command,
        f"http://127.0.0.1:{port}",
        workdir / "logs" / "proxy.log",
        env={"CLAW_RUN_DIR": str(workdir / "run"), **(env or {})},
        cwd=workdir,
    )


POOL_CLAIM_GRACE = "DAGSTER_OP_CONCURRENCY_KEYS_ALLOTTED_FOR_STARTED_RUN_SECONDS"
POOL_CLAIM_GRACE_S = "1"
"""How long the run queue counts a just-started run as holding the pools of its first step
(Dagster's ``DAGSTER_OP_CONCURRENCY_KEYS_ALLOTTED_FOR_STARTED_RUN_SECONDS``, 5 by default): a
refresh run claims its first pool within a fraction of a second and frees it when its first step
ends, so after 5 s the next run would wait for a slot that is free (docs/dagster.md)."""


def start_dagster(port: int, workdir: Path, env: dict[str, str] | None = None) -> Service:
    """``dagster dev`` (webserver + daemon) on the installed code location, state under workdir:
    its instance config is the dagster.yaml of ``config_files``, its workspace one written here.
    ``POOL_CLAIM_GRACE_S`` applies unless the environment sets it."""
    dagster_home = workdir / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(config_file("dagster.yaml"), dagster_home / "dagster.yaml")
    workspace = dagster_home / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": CODE_LOCATION}]}))
    command = ["dagster", "dev", "-w", str(workspace), "-h", "127.0.0.1"]
    return start_service(
        "dagster",
        [str(Path(sys.executable).parent / command[0]), *command[1:], "-p", str(port)],
        f"http://127.0.0.1:{port}",
        workdir / "logs" / "dagster.log",
        env={
            POOL_CLAIM_GRACE: os.environ.get(POOL_CLAIM_GRACE, POOL_CLAIM_GRACE_S),
            **(env or {}),
            "DAGSTER_HOME": str(dagster_home),
        },
        cwd=dagster_home,
    )


def start_inspector(port: int, workdir: Path, env: dict[str, str] | None = None) -> Service:
    return start_service(
        "inspector",
        [*CLI, "inspect", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        workdir / "logs" / "inspector.log",
        env=env,
        cwd=workdir,
    )


@dataclass(frozen=True)
class PortRequest:
    """A port ``claw up`` will give a service, and the option that changes it."""

    service: str
    host: str
    port: int
    option: str


def check_ports(requests: list[PortRequest]) -> None:
    """Fail before anything starts if two services share a port or one is taken.

    Without this, a server already on a port answers the readiness poll in place of ours.
    """
    by_port: dict[int, PortRequest] = {}
    for request in requests:
        if request.port in by_port:
            other = by_port[request.port]
            raise ServiceStartError(
                f"{other.service} and {request.service} are both given port "
                f"{request.port}; change one with {other.option} or {request.option}"
            )
        by_port[request.port] = request
        try:
            probe_bind(request.host, request.port)
        except OSError as error:
            raise ServiceStartError(
                f"cannot bind the {request.service} to {request.host}:{request.port} "
                f"({error.strerror or error}); stop what holds it or pick another port with "
                f"{request.option}"
            ) from error


@dataclass
class Stack:
    services: list[Service] = field(default_factory=list)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop(grace_s=5 if service.name == "dagster" else 15)


def run_stack(
    host: str,
    proxy_port: int,
    dagster_port: int,
    inspector_port: int,
    engine_port: int,
    compat: str | None = None,
) -> None:
    """Start everything, print the URLs, and run until Ctrl-C (or SIGTERM), then stop it all.

    Exits non-zero, having stopped whatever it started, when a service cannot start or dies.
    The batch recipes are loaded first: Dagster would come up with a failed code location, so
    a refused recipe stops it, with the recipe and field named, before anything starts; so does
    a lake the services would refuse (``Lake.checked``).
    ``compat`` is passed on to the proxy (``claw proxy --compat``).
    """
    recipes_file = config_file("batches.yaml")
    try:
        load_recipes(recipes_file)
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        raise SystemExit(f"claw up: {recipes_file}: {error}") from error
    workdir = Path.cwd()
    claw_dir = workdir / ".claw"
    env = {
        "CLAW_LAKE_URI": os.environ.get("CLAW_LAKE_URI", str(claw_dir / "lake")),
        "CLAW_SPOOL_DIR": os.environ.get("CLAW_SPOOL_DIR", str(claw_dir / "spool")),
        "CLAW_DAGSTER_URL": f"http://127.0.0.1:{dagster_port}",
        "LITELLM_MASTER_KEY": os.environ.get("LITELLM_MASTER_KEY", LOCAL_MASTER_KEY),
    }
    try:
        Lake.checked(ClawSettings(lake_uri=env["CLAW_LAKE_URI"]))
    except LakeStoreError as error:
        raise SystemExit(f"claw up: {error}") from error
    stack = Stack()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        check_ports(
            [
                PortRequest("embedded engine", "127.0.0.1", engine_port, "--engine-port"),
                PortRequest("capture proxy", host, proxy_port, "--proxy-port"),
                PortRequest("Dagster UI", "127.0.0.1", dagster_port, "--dagster-port"),
                PortRequest("inspector", "127.0.0.1", inspector_port, "--inspector-port"),
            ]
        )
        engine = start_engine(engine_port, claw_dir, env)
        stack.services.append(engine)
        engine.wait_ready("/health", timeout_s=60)
        proxy = start_proxy(proxy_port, claw_dir, f"{engine.url}/v1", env, host=host, compat=compat)
        stack.services.append(proxy)
        dagster = start_dagster(dagster_port, claw_dir, env)
        stack.services.append(dagster)
        inspector = start_inspector(inspector_port, claw_dir, env)
        stack.services.append(inspector)
        proxy.wait_ready("/health/liveliness", timeout_s=180)
        inspector.wait_ready("/api/health", timeout_s=60)
        dagster.wait_ready("/server_info", timeout_s=240)
        key_hint = (
            repr(LOCAL_MASTER_KEY)
            if env["LITELLM_MASTER_KEY"] == LOCAL_MASTER_KEY
            else "from LITELLM_MASTER_KEY"
        )
        print(
            "\nclaw-pipelines is up (Ctrl-C stops everything):\n"
            f"  capture proxy   {proxy.url}/v1   model 'policy', key {key_hint}\n"
            f"  embedded engine {engine.url}/v1  (simulator)\n"
            f"  Dagster UI      {dagster.url}\n"
            f"  inspector       {inspector.url}\n"
            f"  lake            {env['CLAW_LAKE_URI']}\n"
            f"  config          {get_settings().config_dir or 'the shipped defaults'}\n"
            f"  logs            {claw_dir / 'logs'}\n"
            "Try: claw demo\n",
            flush=True,
        )
        while all(service.alive() for service in stack.services):
            time.sleep(1)
        dead = [s for s in stack.services if not s.alive()]
        for service in dead:
            print(f"{service.name} exited; log tail:\n{service.log_tail()}", file=sys.stderr)
        raise SystemExit(f"claw up: {', '.join(s.name for s in dead)} exited; stopping the rest")
    except (ServiceStartError, TimeoutError) as error:
        raise SystemExit(f"claw up: {error}") from error
    except KeyboardInterrupt:
        print("\nstopping…", flush=True)
    finally:
        stack.stop()
