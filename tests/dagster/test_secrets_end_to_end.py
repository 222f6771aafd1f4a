"""Issue 35's last check: every credential shape, planted on every route of the real proxy and an
inspector label note, lands nowhere after the whole Dagster chain ran to grpo and sft exports:
no file under the lake root (tables, Delta logs, exports; parquet decoded and raw), no log file,
nothing in Dagster's storage. The ordinary look-alikes (a UUID, 'bearer' in prose) are kept."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import pyarrow.parquet as pq
import pytest
from dagster_harness import Bound, Driver
from fastapi.testclient import TestClient
from stack_fixtures import CaptureStack, launch_stack

from claw_pipelines.batches.rows import batch_rows
from claw_pipelines.inspector.server import create_app
from claw_pipelines.redaction import REDACTED
from resources.lake import LakeResource

sys.path.append(str(Path(__file__).resolve().parent.parent / "capture"))  # the shapes, shared
from test_capture_secrets import KEPT, credential_shapes

ROUTES = ("chat", "responses", "messages", "steps")
"""One route per member of a group: each group of four has every route."""
GROUPS = 4


@pytest.fixture(scope="module")
def capture_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureStack]:
    """A proxy of this test's own: on the suite's shared one, other tests' finished trajectories
    fill the first grpo and sft batches and leave some of these waiting for more."""
    stack = launch_stack(tmp_path_factory.mktemp("secrets"))
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()


def _post(stack: CaptureStack, path: str, body: dict) -> httpx.Response:
    answer = httpx.post(
        stack.proxy_url + path,
        json=body,
        headers={"authorization": f"Bearer {stack.key}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return answer


def _plant(stack: CaptureStack, route: str, trajectory: str, group: str, said: str, key: str):
    """One call on ``route`` carrying every shape (and ``key`` as a JSON key); its turn id."""
    prefix = f"/t/{trajectory}/{group}/v1"
    schema = {"type": "object", "properties": {key: {"type": "string", "description": said}}}
    if route == "chat":
        tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        body = {
            "model": "policy",
            "messages": [{"role": "user", "content": said}],
            "tools": tools,
            "metadata": {key: said, "note": {said: [said]}},
        }
        return _post(stack, f"{prefix}/chat/completions", body).headers["x-litellm-call-id"]
    if route == "responses":
        body = {"model": "policy", "instructions": said, "input": said}
        return _post(stack, f"{prefix}/responses", body).headers["x-litellm-call-id"]
    if route == "messages":
        tool_use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {key: said}}
        tool_result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": said}
        body = {
            "model": "policy",
            "max_tokens": 16,
            "system": said,
            "tools": [{"name": "f", "input_schema": schema}],
            "messages": [
                {"role": "user", "content": said},
                {"role": "assistant", "content": [tool_use]},
                {"role": "user", "content": [tool_result]},
            ],
        }
        return _post(stack, f"{prefix}/messages", body).headers["x-litellm-call-id"]
    step = {
        "trajectory_id": trajectory,
        "group_id": group,
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": [4, 5],
        "response_logprobs": [-0.5, -0.5],
        "finish_reason": said,
        "response_text": said,
        "messages": [{"role": "user", "content": said}],
        "metadata": {key: said},
    }
    return _post(stack, "/claw/v1/steps", step).json()["turn_id"]


def _needles(shapes: dict[str, tuple[str, str]]) -> list[str]:
    """Each secret and its halves: a cut text (a sample cell, a statistic) keeps only a part."""
    needles = []
    for _, secret in shapes.values():
        half = len(secret) // 2
        needles += [secret, secret[:half], secret[half:]]
    return needles


def _decoded(path: Path) -> str:
    """A file's content as text: parquet's columns that hold text (its pages are compressed;
    token ID lists hold none), else its bytes."""
    if path.suffix != ".parquet":
        return path.read_bytes().decode("utf-8", errors="replace")
    schema = pq.read_schema(path)
    texts = [f.name for f in schema if "string" in str(f.type) or "binary" in str(f.type)]
    rows = pq.read_table(path, columns=texts).to_pylist()
    return json.dumps(rows, default=str, ensure_ascii=False)


def _texts_under(root: Path) -> dict[Path, str]:
    """Every file under ``root``, decoded and raw (raw bytes as latin-1, byte for byte)."""
    return {
        path: _decoded(path) + path.read_bytes().decode("latin-1")
        for path in root.rglob("*")
        if path.is_file()
    }


def _event_log_text(instance: dg.DagsterInstance) -> str:
    """Every event Dagster stored, as its serialized text (what its storage holds)."""
    runs = instance.get_runs()
    assert runs
    events = [event for run in runs for event in instance.all_logs(run.run_id)]
    return "\n".join(dg.serialize_value(event) for event in events)


def test_each_shape_on_every_route_lands_nowhere_through_the_chain(
    capture_stack: CaptureStack, instance: dg.DagsterInstance
) -> None:
    shapes = credential_shapes()
    said = " ; ".join(text for text, _ in shapes.values()) + " ; " + KEPT
    key = shapes["key used as a JSON key"][0]
    run = secrets.token_hex(4)
    turn_ids, trajectories = [], []
    for group_index in range(GROUPS):
        group = f"secrets-g{group_index}-{run}"
        for member, route in enumerate(ROUTES):
            trajectory = f"secrets-t{group_index}{member}-{run}"
            trajectories.append(trajectory)
            turn_ids.append(_plant(capture_stack, route, trajectory, group, said, key))
    capture_stack.wait_for_rows(lambda df: set(turn_ids) <= set(df["turn_id"]))

    app = create_app(capture_stack.lake, background=False)
    with TestClient(app) as inspector:
        label = {"target_kind": "trajectory", "target_ids": trajectories[:1]}
        label |= {"note": said, "author": "curator"}
        assert inspector.post("/api/labels", json=label).status_code == 200
    for index, trajectory in enumerate(trajectories):
        reward = {"trajectory_id": trajectory, "value": index % 2, "metadata": {key: said}}
        _post(capture_stack, "/claw/v1/rewards", reward)
        _post(
            capture_stack, f"/claw/v1/trajectories/{trajectory}/complete", {"metadata": {key: said}}
        )
    for table in ("rewards", "trajectory_events"):
        capture_stack.wait_for_rows(lambda df: set(trajectories) <= set(df["trajectory_id"]), table)

    driver = Driver(Bound.over(LakeResource(lake_uri=capture_stack.lake.root)), instance)
    driver.refresh()
    batched: set[str] = set()
    for recipe in ("grpo", "sft"):
        planned = driver.tick(f"batch_{recipe}_planner")
        assert isinstance(planned, dg.SensorResult), planned
        for request in planned.run_requests:
            driver.materialize([f"batch_{recipe}", f"export_{recipe}"], request.partition_key)
            batch = batch_rows(capture_stack.lake, recipe, recipe, request.partition_key)
            batched |= {f"{recipe}:{t}" for t in batch["trajectory_id"]}
    assert {f"grpo:{t}" for t in trajectories} <= batched
    assert {f"sft:{t}" for t in trajectories[1::2]} <= batched  # the reward-1 ones

    files = _texts_under(capture_stack.workdir)  # the lake, logs, spool, engine answers
    exports = {path: text for path, text in files.items() if "exports" in path.parts}
    assert {p.parts[p.parts.index("exports") + 1] for p in exports} >= {"grpo", "sft"}
    assert any("_delta_log" in path.parts for path in files)
    assert {"engine.log", "proxy.log"} <= {path.name for path in files}
    storage = _texts_under(Path(instance.root_directory))
    storage[Path("dagster event log")] = _event_log_text(instance)
    for path, text in {**files, **storage}.items():
        for needle in _needles(shapes):
            assert needle not in text, f"a secret ({needle}) is in {path}"
    assert REDACTED in storage[Path("dagster event log")]  # scrubbed sample cells were stored

    uuid, prose = KEPT.split(", and ")
    for kept in (uuid, prose):
        assert any(kept in text for text in exports.values()), kept
    labels = capture_stack.lake.scan("labels").filter(pl.col("target_id") == trajectories[0])
    assert KEPT in labels.collect()["note"].item()
