"""The object-store tests' S3 and proxies: a moto server on a loopback port (s3_server.py)
with authentication on, a bucket per lake, and a fleet of capture proxies writing to one lake.

Credentials are always given explicitly: without them the AWS clients would look for an
instance role at a non-loopback address.
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
from stack_fixtures import capture_env

from claw_pipelines.lake import Lake
from claw_pipelines.processes import Service, free_port, start_service
from claw_pipelines.stack import start_proxy

HERE = Path(__file__).resolve().parent
PROXIES = 3
REGION = "us-east-1"
S3_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


@dataclass(frozen=True)
class S3:
    """A running S3 server and the credentials of a user allowed to use it."""

    service: Service
    access_key: str
    secret_key: str

    @property
    def endpoint(self) -> str:
        return self.service.url

    def options(self, **overrides: str) -> dict[str, str]:
        """delta-rs storage options for this server (``overrides`` replace or add some)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            **overrides,
        }

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
        )

    def new_lake(self) -> Lake:
        """A lake under a bucket of its own."""
        bucket = f"claw-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=bucket)
        return Lake(f"s3://{bucket}/lake", self.options())

    def keys(self, lake: Lake) -> list[str]:
        bucket = lake.root.removeprefix("s3://").split("/", 1)[0]
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


def lake_env(root: str, options: dict[str, str]) -> dict[str, str]:
    """The environment that points a service at a lake."""
    return {"CLAW_LAKE_URI": root, "CLAW_STORAGE_OPTIONS": json.dumps(options)}


def start_s3(workdir: Path) -> S3:
    """Start the server, make a user with S3 rights, then turn authentication on (moto's
    ``reset-auth``): from then on every request must be signed with that user's key."""
    port = free_port()
    command = [sys.executable, str(HERE / "s3_server.py"), "--port", str(port)]
    service = start_service("s3", command, f"http://127.0.0.1:{port}", workdir / "s3.log")
    try:
        service.wait_ready("/moto-api/data.json", timeout_s=60)
        iam = boto3.client(
            "iam",
            endpoint_url=service.url,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
            region_name=REGION,
        )
        iam.create_user(UserName="lake")
        iam.put_user_policy(UserName="lake", PolicyName="s3", PolicyDocument=json.dumps(S3_POLICY))
        key = iam.create_access_key(UserName="lake")["AccessKey"]
        httpx.post(f"{service.url}/moto-api/reset-auth", content=b"0").raise_for_status()
    except Exception:
        service.stop()
        raise
    return S3(service, key["AccessKeyId"], key["SecretAccessKey"])


@dataclass
class Fleet:
    """An engine and ``PROXIES`` capture proxies on one S3 lake, each with its own workdir and
    spool on local disk, as proxies on separate machines are."""

    lake: Lake
    engine: Service
    key: str
    root: Path
    proxies: list[Service | None]

    def workdir(self, index: int) -> Path:
        return self.root / f"proxy-{index}"

    def env(self, index: int) -> dict[str, str]:
        """Staged commits, as docs/deployment.md runs a fleet: one committer for all."""
        return {
            **capture_env(self.workdir(index), self.key),
            **lake_env(self.lake.root, self.lake.storage_options),
            "CLAW_COMMIT_MODE": "staged",
        }

    def start(self, index: int, port: int | None = None) -> Service:
        """Start proxy ``index`` (on ``port``, default a free one) without waiting for it."""
        backend = f"{self.engine.url}/v1"
        proxy = start_proxy(port or free_port(), self.workdir(index), backend, self.env(index))
        self.proxies[index] = proxy
        return proxy

    def stop(self) -> None:
        for proxy in self.proxies:
            if proxy is not None:
                proxy.stop(grace_s=30)
        self.engine.stop()
