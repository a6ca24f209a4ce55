"""A proxy host through a bucket outage (`collector/spooler.py`, `collector/handoff.py`):
a bucket that hangs never holds up serving or the spool's rotation; a spool directory
at `collector.max_spool_bytes` answers on, unlogged and counted; a long backlog keeps
its host's watermark fresh. Real `onjob serve` processes, a socket that never answers,
and moto's S3 server."""

from __future__ import annotations

import socket
import time

import httpx
import msgspec
import pytest
from openai import OpenAI

from onjob.bucket import Bucket
from onjob.cli.process import ServerProcess, free_port
from onjob.collector.handoff import Uploader, Watermark
from onjob.collector.spool import Spool

from .s3_server import CREDENTIALS, bucket_url, s3_endpoint  # noqa: F401  (fixtures)


@pytest.fixture
def hanging_endpoint():
    """An S3 endpoint that takes connections and never answers a byte."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)  # the kernel completes the handshakes; nothing reads or answers
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def proxy_host(tmp_path, fake_engine_url, endpoint: str, **env: str) -> ServerProcess:
    (tmp_path / "host").mkdir(exist_ok=True)
    return ServerProcess(
        ["--engine-url", fake_engine_url, "--db", str(tmp_path / "host" / "onjob.duckdb"),
         "--primary", f"http://127.0.0.1:{free_port()}"],
        env={
            "ONJOB_COLLECTOR__BUCKET": "s3://outage/onjob",
            "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": endpoint,
            "ONJOB_COLLECTOR__HOST_ID": "host-a",
            "ONJOB_COLLECTOR__ROTATE_S": "0.5",
            **CREDENTIALS,  # signed requests, sent: the endpoint takes them and never answers
            **env,
        },
        log=tmp_path / "host.log",
    )  # fmt: skip


def test_a_hanging_bucket_holds_up_neither_answers_nor_the_spools_rotation(
    tmp_path, fake_engine_url, hanging_endpoint
):
    spool = tmp_path / "host" / "onjob.duckdb.spool"
    with proxy_host(tmp_path, fake_engine_url, hanging_endpoint) as host:
        client = OpenAI(base_url=host.url, api_key="unused", max_retries=0, timeout=10)
        took = []
        for i in range(12):  # over about 3 s: six rotations
            start = time.monotonic()
            client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3
            )
            took.append(time.monotonic() - start)
            time.sleep(0.25)
        closed = list(spool.glob("*.jsonl"))
    # Each half second's answers closed in a segment of their own, on disk until the
    # bucket answers (the first hand-off round still waits on it).
    assert len(closed) >= 4, [p.name for p in spool.iterdir()]
    assert max(took) < 2


def test_a_full_spool_directory_answers_on_unlogged_and_says_so(
    tmp_path, fake_engine_url, hanging_endpoint
):
    spool = tmp_path / "host" / "onjob.duckdb.spool"
    env = {"ONJOB_COLLECTOR__MAX_SPOOL_BYTES": str(1 << 20), "ONJOB_PROXY__ADMIN_KEY": "adm-out"}

    def held() -> int:
        return sum(p.stat().st_size for p in spool.iterdir() if p.suffix in (".jsonl", ".part"))

    with proxy_host(tmp_path, fake_engine_url, hanging_endpoint, **env) as host:
        client = OpenAI(base_url=host.url, api_key="unused", max_retries=0, timeout=10)
        big = "x" * 100_000

        def ask(i: int) -> None:
            reply = client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": f"{i} {big}"}], max_tokens=3
            )
            assert reply.choices[0].message.content  # answered, logged or not

        def collector() -> dict:
            as_admin = {"Authorization": "Bearer adm-out"}  # the counters are its alone
            health = httpx.get(f"{host.base}/health", headers=as_admin, timeout=10)
            return health.json()["collector"]

        i = 0
        while collector()["unlogged"] == 0:  # past the cap (at most a second's lines past)
            ask(i := i + 1)
            assert i < 200, "never full"
        size = held()
        for _ in range(10):
            ask(i := i + 1)
        log = host.output()
        counts = collector()
    assert held() == size  # nothing more written once full
    assert counts["unlogged"] >= 10 and counts["spooled"] + counts["unlogged"] == i
    assert "answering without logging" in log


def test_a_long_backlog_keeps_its_hosts_watermark_fresh(tmp_path, bucket_url, s3_endpoint):  # noqa: F811
    spool = Spool(tmp_path / "host")
    for i in range(6):
        spool.append(b'{"kind": "x", "i": %d}' % i)
        spool.rotate()
    bucket = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)
    marks: list[Watermark] = []

    def seen(params, **_):  # botocore's own hook: each watermark as it is sent
        if params["Key"].endswith("hosts/host-a.json"):
            marks.append(msgspec.json.decode(params["Body"], type=Watermark))

    bucket._client.meta.events.register("before-parameter-build.s3.PutObject", seen)
    # A lease so short that each upload takes longer than a third of it.
    uploader = Uploader(spool.directory, bucket, "host-a", lease_s=0.001)
    final = uploader.upload()
    # Rewritten as the backlog went, each promising no more than what was left to go.
    assert len(marks) == 6 and marks[-1] == final
    assert [m.holds_from for m in marks] == sorted(m.holds_from for m in marks)
