"""A real S3 API server for tests: moto's, as its own process on a free port, with a
fresh bucket per test. Import the fixtures into a test module to use them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from onjob.cli.process import free_port

# moto accepts any credentials; boto3 insists on some. Children inherit them.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server running for the session (`python -m moto.server`)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    deadline = time.monotonic() + 60
    try:
        while True:  # ready when it answers
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def bucket_url(s3_endpoint) -> str:
    """`s3://<a new bucket>/onjob`: an empty bucket of this test's own."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return f"s3://{name}/onjob"


def bucket_env(bucket_url: str, endpoint: str, **settings: object) -> dict[str, str]:
    """The environment of an `onjob serve` handing over through the bucket: the loop off,
    and `settings` by their environment names (`proxy__admin_key="..."`)."""
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_COLLECTOR__BUCKET": bucket_url,
        "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": endpoint,
    }
    return env | {f"ONJOB_{name.upper()}": str(value) for name, value in settings.items()}


def server_in(work, name: str, engine_url: str, env: dict, *args: str, port: int = 0):
    """`onjob serve` as host `host-<name>`, its database and log in `work/<name>`."""
    from onjob.cli.process import ServerProcess

    (work / name).mkdir(exist_ok=True)
    return ServerProcess(
        ["--engine-url", engine_url, "--db", str(work / name / "onjob.duckdb"), *args],
        port=port,
        env={**env, "ONJOB_COLLECTOR__HOST_ID": f"host-{name}"},
        log=work / f"{name}.log",
    )
