"""The inspector's key: ``claw inspect`` refuses a non-loopback interface without a strong one,
and with a key set every page, API call and static file needs it."""

from __future__ import annotations

import base64
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from lake_rows import land_rollouts
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect
from starlette.routing import Mount

from claw_pipelines.inspector.server import create_app
from claw_pipelines.lake import Lake
from claw_pipelines.processes import free_port, start_service

CLI = [sys.executable, "-m", "claw_pipelines.cli"]
KEY = secrets.token_urlsafe(24)


def _inspect(*args: str, key: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CLAW_INSPECTOR_KEY"}
    if key is not None:
        env["CLAW_INSPECTOR_KEY"] = key
    return subprocess.run(
        [*CLI, "inspect", *args], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (None, "without CLAW_INSPECTOR_KEY"),
        ("k" * 23, "with a weak CLAW_INSPECTOR_KEY"),
        ("a" * 40, "with a weak CLAW_INSPECTOR_KEY"),
    ],
    ids=["no key", "23 characters", "40 repeated characters"],
)
def test_claw_inspect_refuses_a_non_loopback_bind_without_a_strong_key(
    key: str | None, why: str
) -> None:
    refused = _inspect("--host", "0.0.0.0", "--port", str(free_port()), key=key)
    assert refused.returncode != 0
    line = (refused.stdout + refused.stderr).strip().splitlines()[-1]
    assert line.startswith(f"claw inspect: refusing to bind 0.0.0.0 {why}"), line
    assert ">= 24 characters and >= 72 bits of character entropy" in line


def _urls(app) -> list[str]:
    """One URL per GET route of the app (path parameters filled in) and one static file."""
    urls = []
    for route in app.routes:
        if isinstance(route, APIRoute) and "GET" in route.methods:
            urls.append(re.sub(r"\{[^}]+\}", "x", route.path))
        elif isinstance(route, Mount):
            urls.append(f"{route.path}/app.css")
    return urls


def _basic(key: str) -> str:
    return "Basic " + base64.b64encode(f"anyone:{key}".encode()).decode()


def test_with_a_key_every_page_api_call_and_file_needs_it(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    rollouts = land_rollouts(lake, groups=1, rollouts=1)
    app = create_app(lake, background=False, key=KEY)
    with TestClient(app) as client:
        urls = _urls(app)
        assert {"/", "/trajectories", "/api/overview", "/static/app.css"} <= set(urls)
        for url in urls:
            for authorization in (None, "Bearer wrong", _basic("wrong"), f"Bearer {KEY[:-1]}"):
                headers = {"authorization": authorization} if authorization else {}
                refused = client.get(url, headers=headers)
                assert refused.status_code == 401, (url, authorization, refused.status_code)
                assert refused.headers["www-authenticate"].startswith("Basic")
            for authorization in (f"Bearer {KEY}", _basic(KEY)):
                answer = client.get(url, headers={"authorization": authorization})
                assert answer.status_code != 401, (url, authorization)
        label = {"target_kind": "trajectory", "target_ids": rollouts.trajectories[:1]}
        label |= {"trainable": False, "author": "mallory"}
        assert client.post("/api/labels", json=label).status_code == 401
        assert lake.scan("labels") is None
        saved = client.post("/api/labels", json=label, headers={"authorization": _basic(KEY)})
        assert saved.status_code == 200, saved.text


def test_a_browser_given_the_key_uses_the_inspector(chromium, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    land_rollouts(lake, groups=1, rollouts=2)
    port = free_port()
    service = start_service(
        "inspector",
        [*CLI, "inspect", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        tmp_path / "inspector.log",
        env={"CLAW_LAKE_URI": lake.root, "CLAW_INSPECTOR_KEY": KEY},
    )
    try:
        _wait_for_401(service.url)
        stranger = chromium.new_context()
        with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
            stranger.new_page().goto(service.url + "/")  # answered 401 with a Basic challenge
        stranger.close()
        curator = chromium.new_context(http_credentials={"username": "ann", "password": KEY})
        page = curator.new_page()
        assert page.goto(service.url + "/").status == 200
        expect(page.locator('[data-field="turns_total"]')).to_have_text(re.compile(r"^\d+$"))
        curator.close()
    finally:
        service.stop()


def _wait_for_401(url: str) -> None:
    """Wait until the inspector answers (a request without the key gets 401)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/api/health", timeout=2).status_code == 401:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"the inspector at {url} did not answer within 60 s")


@pytest.mark.parametrize("key", [None, KEY], ids=["loopback, no key", "with the key"])
def test_a_label_write_from_another_origin_is_refused(tmp_path: Path, key: str | None) -> None:
    """A browser sends remembered credentials with any site's request, and an open loopback
    inspector needs none: a write carrying another site's ``Origin`` is refused either way."""
    lake = Lake(str(tmp_path / "lake"))
    rollouts = land_rollouts(lake, groups=1, rollouts=1)
    app = create_app(lake, background=False, key=key)
    auth = {"authorization": _basic(KEY)} if key else {}
    label = {"target_kind": "trajectory", "target_ids": rollouts.trajectories[:1]}
    label |= {"trainable": False, "author": "mallory"}
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        for origin in ("http://127.0.0.2:8765", "http://127.0.0.1:9999", "null"):
            refused = client.post("/api/labels", json=label, headers={**auth, "origin": origin})
            assert refused.status_code == 403, (origin, refused.text)
        assert lake.scan("labels") is None
        assert client.get("/api/overview", headers={**auth, "origin": "null"}).status_code == 200
        for origin in ({"origin": "http://127.0.0.1:8765"}, {}):
            saved = client.post("/api/labels", json=label, headers={**auth, **origin})
            assert saved.status_code == 200, saved.text
    assert lake.scan("labels").collect().height == 2
