"""An S3 lake commits safely for several writers, and a store that would not is refused at start."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from s3_lake import S3

from claw_pipelines.lake import Lake
from claw_pipelines.lake.store import LakeStoreError, store_options
from claw_pipelines.processes import free_port

UNSAFE = [
    ({"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, "AWS_S3_ALLOW_UNSAFE_RENAME is set"),
    ({"aws_s3_allow_unsafe_rename": "1"}, "AWS_S3_ALLOW_UNSAFE_RENAME is set"),
    ({"AWS_S3_LOCKING_PROVIDER": "dynamodb"}, "no S3 locking provider"),
    ({"conditional_put": "disabled"}, "conditional_put is 'disabled'"),
    ({"aws_conditional_put": "dynamo:locks"}, "conditional_put is 'dynamo:locks'"),
]


def test_s3_lakes_state_conditional_put_and_other_stores_are_left_alone() -> None:
    for root in ("s3://bucket/lake", "s3a://bucket/lake", "S3://bucket/lake"):
        assert Lake(root, {"AWS_REGION": "eu-west-1"}).storage_options == {
            "AWS_REGION": "eu-west-1",
            "conditional_put": "etag",
        }
    assert Lake("s3://b/l", {"AWS_CONDITIONAL_PUT": "etag"}).storage_options == {
        "AWS_CONDITIONAL_PUT": "etag"
    }
    assert Lake("s3://b/l", {"AWS_S3_ALLOW_UNSAFE_RENAME": "false"}).storage_options
    for root in ("/tmp/lake", "gs://bucket/lake", "az://container/lake", "memory:///lake"):
        assert Lake(root, {"k": "v"}).storage_options == {"k": "v"}


def _variable(option: str) -> str:
    """The environment variable of a storage option (``conditional_put``: AWS_CONDITIONAL_PUT)."""
    return "AWS_" + option.upper().removeprefix("AWS_")


@pytest.mark.parametrize(("options", "message"), UNSAFE)
def test_settings_that_turn_off_safe_commits_are_refused(options, message) -> None:
    with pytest.raises(LakeStoreError, match=message):
        Lake("s3://bucket/lake", options)
    with pytest.raises(LakeStoreError, match=message):  # delta-rs reads AWS_* variables too
        store_options("s3://bucket/lake", {}, environ={_variable(k): v for k, v in options.items()})
    assert store_options("/local/lake", options) == options


def test_the_start_check_passes_on_s3_and_leaves_nothing(s3: S3) -> None:
    lake = s3.new_lake()
    lake.check_writable()
    assert s3.keys(lake) == []


def test_concurrent_writers_lose_no_commit_on_s3(s3: S3) -> None:
    """Four writers append from their own handles at once, as four proxies would: every commit
    lands at its own version (a store that let one overwrite another would lose rows here)."""
    lake = s3.new_lake()
    schema = pa.schema([("writer", pa.int32()), ("n", pa.int32())])
    lake.ensure("rows", schema)

    def write(writer: int) -> None:
        table = lake.writer("rows")
        for n in range(6):
            table.append(pa.table({"writer": [writer], "n": [n]}, schema))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = lake.scan("rows").collect()
    assert lake.version("rows") == 24
    assert sorted(rows.iter_rows()) == [(w, n) for w in range(4) for n in range(6)]


def _refusal(lake: Lake) -> str:
    with pytest.raises(LakeStoreError) as refused:
        lake.check_writable()
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_misconfigured_store_is_refused_in_one_line(s3: S3) -> None:
    bucket = s3.new_lake().root.removeprefix("s3://").split("/")[0]
    nowhere = f"http://127.0.0.1:{free_port()}"
    wrong_endpoint = _refusal(Lake(f"s3://{bucket}/lake", s3.options(AWS_ENDPOINT_URL=nowhere)))
    assert wrong_endpoint.startswith(f"cannot write to the lake s3://{bucket}/lake (")
    assert "Connection refused" in wrong_endpoint
    assert wrong_endpoint.endswith("); fix CLAW_LAKE_URI or CLAW_STORAGE_OPTIONS")
    missing = _refusal(Lake("s3://no-such-bucket/lake", s3.options()))
    assert "NoSuchBucket: The specified bucket does not exist" in missing
    bad_secret = _refusal(Lake(f"s3://{bucket}/lake", s3.options(AWS_SECRET_ACCESS_KEY="wrong")))
    assert "SignatureDoesNotMatch" in bad_secret
    unknown_key = Lake(f"s3://{bucket}/lake", s3.options(AWS_ACCESS_KEY_ID="AKIANOSUCHKEY0000000"))
    assert "InvalidAccessKeyId" in _refusal(unknown_key)
