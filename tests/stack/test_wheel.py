"""A new user's install: a wheel of the checkout (``uv build``) in a fresh virtualenv, then
``claw up`` in an empty folder. Nothing may be found by the checkout's layout: the configuration
ships as package data, Dagster loads the code location from the installed packages, and a
config folder the user names (``--config-dir``) reaches every service.

The fresh virtualenv takes the project's hashed lock (from uv's cache, else the registry), then
the wheel without dependencies, as ``make`` does with the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import yaml
from stack_fixtures import kill_leftovers, stopped_by_ctrl_c

from claw_pipelines.processes import free_port, start_service

REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"
RECIPE = "wheel_grpo"
"""The one recipe of the user's config folder: its assets show that Dagster read that folder."""
WORKSPACE_QUERY = """{ workspaceOrError { ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename ... on PythonError { message }
  ... on RepositoryLocation { repositories { assetNodes { assetKey { path } } } } } } } } }"""


def _run(*command: str | Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _installed_wheel(root: Path) -> Path:
    """The bin folder of a fresh virtualenv holding the locked dependencies and the wheel."""
    _run(UV, "build", "--quiet", "--no-build-isolation", "-p", sys.executable,
         "--out-dir", root / "dist", REPO, cwd=root)  # fmt: skip
    (wheel,) = (root / "dist").glob("claw_pipelines-*.whl")
    _run(UV, "venv", "--quiet", "-p", sys.executable, root / "venv", cwd=root)
    python = root / "venv" / "bin" / "python"
    _run(UV, "pip", "install", "--quiet", "--python", python, "--require-hashes",
         "-r", REPO / "requirements.lock", cwd=root)  # fmt: skip
    _run(UV, "pip", "install", "--quiet", "--python", python, "--no-deps", wheel, cwd=root)
    return python.parent


def _user_env() -> dict[str, str]:
    """This environment without the test run's lake, Dagster home, keys or virtualenv."""
    ours = ("CLAW_", "DAGSTER_", "LITELLM_", "VIRTUAL_ENV", "PYTHONPATH")
    env = {name: value for name, value in os.environ.items() if not name.startswith(ours)}
    return {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # as every test: no cost-map fetch


def _config_dir(root: Path) -> Path:
    """A folder holding only a batches.yaml: the shipped grpo recipe, renamed."""
    shipped = yaml.safe_load((REPO / "assets" / "batches.yaml").read_text())
    (grpo,) = [recipe for recipe in shipped["recipes"] if recipe["name"] == "grpo"]
    folder = root / "my-config"
    folder.mkdir()
    (folder / "batches.yaml").write_text(yaml.safe_dump({"recipes": [{**grpo, "name": RECIPE}]}))
    return folder


def _code_location(dagster_url: str, timeout_s: float) -> dict:
    """The workspace entry ``claw_pipelines`` once Dagster has loaded it."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = httpx.post(f"{dagster_url}/graphql", json={"query": WORKSPACE_QUERY}, timeout=60)
        entries = answer.json()["data"]["workspaceOrError"]["locationEntries"]
        if entries and entries[0]["loadStatus"] == "LOADED":
            return entries[0]
        assert time.monotonic() < deadline, f"code location not loaded: {entries}"
        time.sleep(1)


def test_a_wheel_installed_in_a_fresh_venv_runs_claw_up_in_an_empty_folder(tmp_path: Path) -> None:
    bin_dir = _installed_wheel(tmp_path)
    where = _run(bin_dir / "python", "-c", "import assets, claw_pipelines, resources; "
                 "print(claw_pipelines.__file__, assets.__file__, resources.__file__)",
                 cwd=tmp_path)  # fmt: skip
    assert all(path.startswith(str(tmp_path / "venv")) for path in where.split()), where
    config = _config_dir(tmp_path)
    folder = tmp_path / "empty"
    folder.mkdir()
    ports = {name: free_port() for name in ("proxy", "dagster", "inspector", "engine")}
    command = [str(bin_dir / "claw"), "up", f"--config-dir={config}"]
    command += [f"--{name}-port={port}" for name, port in ports.items()]
    up = start_service("claw-up", command, "", tmp_path / "up.log", env=_user_env(), cwd=folder)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while "claw-pipelines is up" not in up.log_tail(10_000):
            assert up.alive() and time.monotonic() < deadline, up.log_tail()
            time.sleep(1)
        children = psutil.Process(up.pid).children(recursive=True)
        assert f"config          {config}" in up.log_tail(10_000)

        proxy = httpx.get(f"http://127.0.0.1:{ports['proxy']}/health/liveliness", timeout=30)
        assert proxy.status_code == 200, proxy.text
        location = _code_location(f"http://127.0.0.1:{ports['dagster']}", timeout_s=120)
        assert location["name"] == "claw_pipelines"
        loaded = location["locationOrLoadError"]
        assert loaded["__typename"] == "RepositoryLocation", loaded
        assets = {
            "/".join(node["assetKey"]["path"])
            for repository in loaded["repositories"]
            for node in repository["assetNodes"]
        }
        assert {"turns", "steps", f"batch_{RECIPE}", f"export_{RECIPE}"} <= assets
        assert "batch_grpo" not in assets  # the user's batches.yaml replaced the shipped one

        left = stopped_by_ctrl_c(up, children)
        assert not left, f"processes left running after Ctrl-C: {left}"
    finally:
        kill_leftovers(up, children)
