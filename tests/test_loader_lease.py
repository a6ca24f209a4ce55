"""One loader at a time (`collector/lease.py`), segments fetched by one loader only, and
hosts' leases judged on the bucket's clock (`collector/handoff.py`): a real S3 API
server (moto's), and real `onjob serve` processes for two loaders started at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec
import pytest
from openai import OpenAI

from onjob.bucket import Bucket
from onjob.cli.process import ServerProcess, free_port
from onjob.collector.handoff import Clock, Fetcher, Uploader, Watermark
from onjob.collector.lease import LEASE, LeaseBody, LoaderLease
from onjob.collector.spool import Spool

from .conftest import rows
from .s3_server import bucket_env, bucket_url, s3_endpoint, server_in  # noqa: F401

ADMIN = "admin-secret"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}  # `/health`'s counters are its alone


@pytest.fixture
def bucket(bucket_url, s3_endpoint) -> Bucket:  # noqa: F811
    return Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)


def until(check, timeout_s: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def test_a_second_loader_waits_until_the_first_ones_lease_ends_then_takes_it(bucket):
    first, second = LoaderLease(bucket, "a", 2), LoaderLease(bucket, "b", 2)
    assert first.renew() and first.body.token == 1
    assert not second.renew() and second.other.holder == "a"
    assert first.renew() and first.renew()  # renewals: the holder keeps it
    assert not second.renew()
    # The first stops renewing (paused, or dead): after its lease on the bucket's clock
    # the second takes over, with the next fencing token.
    until(second.renew, what="the second loader took the lease")
    assert second.body.token == 2
    # The first comes back: its renewal is refused (the object is not the one it wrote),
    # and it stops loading.
    assert not first.renew() and not first.held and first.other is None
    assert not first.renew() and first.other.holder == "b"
    held = msgspec.json.decode(bucket.get_bytes(LEASE), type=LeaseBody)
    assert (held.holder, held.token) == ("b", 2)


def test_a_loader_that_stops_cleanly_hands_its_lease_over_at_once(bucket):
    first, second = LoaderLease(bucket, "a", 60), LoaderLease(bucket, "b", 60)
    assert first.renew() and not second.renew()
    first.release()
    assert second.renew() and second.body.token == 2  # no wait for the lease to run out
    # A loader restarting on its own lease takes it back at once too.
    again = LoaderLease(bucket, "b", 60)
    assert again.renew() and again.body.token == 3


def test_a_holder_counts_its_lease_lost_a_lease_after_its_last_renewal_whatever_the_bucket(
    bucket,
    s3_endpoint,  # noqa: F811
):
    lease = LoaderLease(bucket, "a", 0.5)
    assert lease.renew() and lease.held
    # The bucket stops answering: the holder cannot know whether another took over.
    lease.bucket = Bucket.from_url("s3://nowhere", endpoint_url="http://127.0.0.1:9")
    lease.bucket._client.meta.config.retries = {"max_attempts": 1}
    until(lambda: not lease.renew(), what="the lease counted lost")


def test_a_segment_fetched_by_another_loader_is_left_to_it(bucket, tmp_path):
    spool = Spool(tmp_path / "host")
    for line in (b'{"kind": "x"}', b'{"kind": "y"}'):
        spool.append(line)
        spool.rotate()
    Uploader(spool.directory, bucket, "host-a").upload()
    names = sorted(o.key.removeprefix("segments/") for o in bucket.list("segments/"))
    # Loader b fetched the first one (its tombstone written) and died before deleting it.
    bucket.put_bytes(f"fetched/{names[0]}", b"loader-b")
    (tmp_path / "a").mkdir()
    fetcher = Fetcher(tmp_path / "a", bucket, lease_s=60, holder="loader-a")
    try:
        assert fetcher.fetch().fetched == 1
    finally:
        fetcher.close()
    assert sorted(p.name for p in (tmp_path / "a").glob("*.jsonl")) == names[1:]
    assert bucket.get_bytes(f"fetched/{names[1]}") == b"loader-a"
    assert [o.key for o in bucket.list("segments/")] == [f"segments/{names[0]}"]  # b's


def test_hosts_leases_are_judged_on_the_buckets_clock_not_theirs(bucket, tmp_path):
    now = int(time.time() * 1000)
    # Host "behind" runs a minute slow and is live; host "ahead" runs an hour fast and
    # stopped writing (no clean stop): each wrote its watermark in its own clock.
    behind = Watermark("behind", now - 60_000 - 500, now - 60_000, offset=60_000)
    ahead = Watermark("ahead", now + 3_600_000, now + 3_600_000, offset=-3_600_000)
    bucket.put_bytes("hosts/ahead.json", msgspec.json.encode(ahead))
    fetcher = Fetcher(tmp_path, bucket, lease_s=2, holder="loader-a")
    try:
        bucket.put_bytes("hosts/behind.json", msgspec.json.encode(behind), overwrite=True)
        remote = fetcher.fetch()
        assert remote.live == ("ahead", "behind")
        # The slow host holds back from its own promise, not a minute earlier.
        assert now - 500 - 1_100 <= remote.before <= now - 500 + 600

        def ahead_dropped() -> bool:
            bucket.put_bytes("hosts/behind.json", msgspec.json.encode(behind), overwrite=True)
            return fetcher.fetch().dropped == ("ahead",)

        # The fast one is taken for dead two seconds after it stopped, not in an hour.
        until(ahead_dropped, what="the stopped host dropped")
        assert fetcher.fetch().live == ("behind",)
    finally:
        fetcher.close()


def test_a_hosts_offset_to_the_buckets_clock_narrows_to_about_a_round_trip(bucket):
    clock = Clock()
    clock.measure(bucket)
    first = clock.error
    assert 400 <= first <= 700  # one Date: half a second, and half a round trip
    deadline = time.monotonic() + 5
    while clock.error > 100 and time.monotonic() < deadline:
        time.sleep(0.13)  # measures at other phases of the bucket's second
        clock.measure(bucket)
    assert clock.error <= 100 and abs(clock.offset) <= 100  # one machine: no offset


def test_two_loaders_started_at_once_one_loads_and_the_other_takes_over_its_database(
    tmp_path,
    fake_engine_url,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    env = bucket_env(
        bucket_url,
        s3_endpoint,
        proxy__admin_key=ADMIN,
        collector__rotate_s=0.5,
        collector__host_lease_s=6,
        collector__snapshot_s=2,  # the database copied to the bucket often
    )

    ports = {"a": free_port(), "b": free_port()}

    def server(name: str, *primary: str) -> ServerProcess:
        """A loader (a or b: each says where it answers, for proxy hosts to find the one
        that loads), or with `primary`, a proxy host."""
        port = ports.get(name, 0)
        here = {"ONJOB_COLLECTOR__ADVERTISE_URL": f"http://127.0.0.1:{port}"} if port else {}
        return server_in(tmp_path, name, fake_engine_url, env | here, *primary, port=port)

    def loader_of(p: ServerProcess) -> str:
        health = httpx.get(f"{p.base}/health", headers=AS_ADMIN, timeout=30)
        return health.json()["collector"]["loader"]

    def ask(p: ServerProcess, n: int, what: str) -> list[str]:
        client = OpenAI(base_url=p.url, api_key="unused", max_retries=0, timeout=60)
        return [
            client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": f"{what} {i}"}], max_tokens=3
            ).id
            for i in range(n)
        ]

    a, b = server("a"), server("b")
    procs = {"a": a, "b": b}
    leader, standby = "a", "b"  # until the lease says which
    try:
        with ThreadPoolExecutor(2) as both:  # at once: neither is up when the other starts
            list(both.map(ServerProcess.start, (a, b)))
        states = {name: loader_of(p) for name, p in procs.items()}
        leader = next(n for n, s in states.items() if s.startswith("this server"))
        standby = "b" if leader == "a" else "a"
        assert states[standby].startswith("standby"), states
        answered = ask(procs[leader], 5, "to the loader") + ask(procs[standby], 5, "to the other")
        until(lambda: set(answered) <= ids(procs[leader]), 60, "everything in the loader's db")
        assert ids(procs[standby]) == set()  # the standby loads nothing
        # A proxy host started with the loader as its --primary.
        procs["p"] = server("p", "--primary", procs[leader].base).start()
        proxied = ask(procs["p"], 2, "through the proxy host")
        bucket = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)
        until(lambda: bucket.list("db/"), 30, "a copy of the loader's database")
        # Answers loaded after a copy: they reach a standby as archived segments.
        mid = ask(procs[leader], 3, "after the copy")
        archive = tmp_path / leader / "onjob.duckdb.spool" / "archive"
        until(
            lambda: set(mid + proxied) <= ids(procs[leader]) and not list(archive.iterdir()),
            60,
            "loaded and archived",
        )

        # The loader dies (kill -9) with the standby's traffic going on: the standby takes
        # over within about a lease and loads what comes after.
        procs[leader].kill()
        later = ask(procs[standby], 5, "after the death")
        until(lambda: loader_of(procs[standby]).startswith("this server"), 60, "fail-over")
        until(lambda: set(later) <= ids(procs[standby]), 60, "the new loader loads")

        # The proxy host finds it through the bucket: feedback it forwards reaches it.
        def feedback() -> int:
            return httpx.post(
                f"{procs['p'].url}/feedback",
                json={"exchange_id": proxied[0], "value": 1.0},
                timeout=60,
            ).status_code

        until(lambda: feedback() == 200, 30, "the proxy host forwards to the new loader")
        # The old loader comes back: a standby now, it hands over what it had not loaded.
        procs[leader] = server(leader).start()
        assert loader_of(procs[leader]).startswith("standby")
        back = ask(procs[leader], 3, "back again")
        until(lambda: set(back) <= ids(procs[standby]), 60, "its traffic reaches the loader")
        said = subprocess.run(
            [sys.executable, "-m", "onjob.cli", "status", "--server", procs[leader].base],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert said.returncode == 0, said.stderr
        assert f"loader: standby: host-{standby}." in said.stdout, said.stdout
    finally:
        # The standbys first: a loader that stops cleanly gives the lease back, and a
        # standby still running would take it, and the database with it.
        for name in ("p", leader, standby):
            if name in procs:
                procs[name].stop()

    # The new loader went on from the old one's copy and the segments it loaded since:
    # every exchange, each once; the old loader's own file stopped at its death.
    query = "SELECT id, count(*) AS n FROM exchanges GROUP BY id"
    first = {r["id"]: r["n"] for r in rows(tmp_path / leader / "onjob.duckdb", query)}
    second = {r["id"]: r["n"] for r in rows(tmp_path / standby / "onjob.duckdb", query)}
    assert set(second) == set(answered + proxied + mid + later + back)
    assert set(second.values()) == {1}
    assert set(first) == set(answered + proxied + mid)


def ids(p: ServerProcess) -> set[str]:
    answer = httpx.post(
        f"{p.base}/admin/sql",
        json={"query": "SELECT id FROM exchanges"},
        headers=AS_ADMIN,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return {r[0] for r in answer.json()["rows"]}


def test_a_conversation_forgotten_on_the_loader_does_not_come_back_through_a_fail_over(
    tmp_path,
    fake_engine_url,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    # The default snapshot_s (an hour): only the deletion makes a copy.
    env = bucket_env(
        bucket_url,
        s3_endpoint,
        proxy__admin_key=ADMIN,
        collector__rotate_s=0.5,
        collector__host_lease_s=4,
    )
    loader = server_in(tmp_path, "a", fake_engine_url, env).start()
    standby = server_in(tmp_path, "b", fake_engine_url, env).start()
    try:
        client = OpenAI(base_url=loader.url, api_key="unused", max_retries=0, timeout=60)
        kept, gone = [], []
        for name, into in (("kept", kept), ("gone", gone)):
            for turn in range(2):
                into.append(
                    client.chat.completions.create(
                        model="agent",
                        messages=[{"role": "user", "content": f"{name} {turn}"}],
                        max_tokens=3,
                        metadata={"trajectory_id": name},
                    ).id
                )
        until(lambda: set(kept + gone) <= ids(loader), 60, "loaded")
        answer = httpx.post(
            f"{loader.base}/admin/forget",
            json={"trajectory": "gone"},
            headers=AS_ADMIN,
            timeout=60,
        )
        assert answer.status_code == 200 and answer.json()["exchanges"] == 2, answer.text
        loader.kill()
        until(lambda: set(kept) <= ids(standby), 60, "the standby took over")
        assert ids(standby) == set(kept)  # the deleted conversation stayed deleted
    finally:
        for p in (loader, standby):
            p.stop()
    left = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint).list("archive/")
    assert left == []  # the copy holds the deletion; no segment holding "gone" is left
