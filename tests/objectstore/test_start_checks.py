"""Every service refuses a lake on a misconfigured object store at start, with one line: the
proxy (before LiteLLM starts), the inspector, the Dagster definitions and ``claw up`` (before it
starts anything)."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3_lake import S3, lake_env
from stack_fixtures import refused_start

from assets.definitions import build_definitions
from claw_pipelines import stack
from claw_pipelines.lake.store import LakeStoreError
from claw_pipelines.processes import free_port


def test_claw_proxy_refuses_a_missing_bucket_and_unsafe_commits(s3: S3, tmp_path: Path) -> None:
    missing = lake_env("s3://no-such-bucket/lake", s3.options())
    line = refused_start(tmp_path, "proxy", "--port", str(free_port()), env=missing)
    assert line.startswith("claw proxy: cannot write to the lake s3://no-such-bucket/lake (")
    assert "NoSuchBucket" in line
    unsafe = lake_env(s3.new_lake().root, s3.options(AWS_S3_ALLOW_UNSAFE_RENAME="true"))
    line = refused_start(tmp_path, "proxy", "--port", str(free_port()), env=unsafe)
    assert line.startswith("claw proxy: AWS_S3_ALLOW_UNSAFE_RENAME is set")


def test_claw_inspect_refuses_bad_credentials(s3: S3, tmp_path: Path) -> None:
    lake = s3.new_lake()
    env = lake_env(lake.root, s3.options(AWS_SECRET_ACCESS_KEY="wrong"))
    line = refused_start(tmp_path, "inspect", "--port", str(free_port()), env=env)
    assert line.startswith(f"claw inspect: cannot write to the lake {lake.root} (")
    assert "SignatureDoesNotMatch" in line


def test_the_dagster_definitions_refuse_a_wrong_endpoint(s3: S3, lake_settings) -> None:
    lake = s3.new_lake()
    lake_settings(lake.root, s3.options(AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(LakeStoreError, match=r"^cannot write to the lake .*Connection refused"):
        build_definitions()
    lake_settings(lake.root, s3.options())
    assert build_definitions().resolve_assets_def("steps")


def test_claw_up_refuses_a_missing_bucket_before_starting_anything(
    s3: S3, lake_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake_settings("s3://no-such-bucket/lake", s3.options())

    def refuse_to_start(*args, **kwargs):
        raise AssertionError("claw up started a service on a lake it cannot write")

    monkeypatch.setattr(stack, "check_ports", refuse_to_start)
    with pytest.raises(SystemExit, match=r"^claw up: cannot write to the lake .*NoSuchBucket"):
        stack.run_stack("127.0.0.1", free_port(), free_port(), free_port(), free_port())
