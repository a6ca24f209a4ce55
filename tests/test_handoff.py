"""Proxies on two hosts, one loader, the hand-off through object storage (`handoff.py`):
real `onjob serve` processes that share no spool directory, a real S3 API server (moto's),
the fake engine, the `openai` client, and kill -9 of a host."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from onjob.bucket import Bucket
from onjob.cli.process import ServerProcess, free_port

from .conftest import rows
from .s3_server import (  # noqa: F401  (fixtures)
    CREDENTIALS,
    bucket_env,
    bucket_url,
    s3_endpoint,
    server_in,
)

ADMIN = "admin-secret"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}  # `/health`'s counters are its alone
AWS = {
    "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
    "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
}
SYSTEM = {"role": "system", "content": "You are the support agent of a shop. Answer briefly."}


def loaded_ids(loader: ServerProcess) -> set[str]:
    """The exchanges the loader's database holds now (`onjob sql` through its admin API)."""
    return {r[0] for r in rows_of(loader, "SELECT id FROM exchanges")}


def collector_of(server: ServerProcess) -> dict:
    """Its collector's counters, as `/health` tells the admin key."""
    return httpx.get(f"{server.base}/health", headers=AS_ADMIN, timeout=30).json()["collector"]


def rows_of(loader: ServerProcess, query: str) -> list[list]:
    answer = httpx.post(
        f"{loader.base}/admin/sql",
        json={"query": query},
        headers=AS_ADMIN,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["rows"]


def wait_for(loader: ServerProcess, ids: set[str], timeout_s: float = 60) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while not ids <= (have := loaded_ids(loader)):
        assert time.monotonic() < deadline, f"never loaded: {sorted(ids - have)}"
    return have


def ask(client: OpenAI, content: str) -> str:
    return client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": content}], max_tokens=3
    ).id


def test_two_hosts_hand_their_spools_to_one_loader_through_a_bucket_and_a_dead_host_loses_nothing(
    tmp_path,
    fake_engine_url,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__ADMIN_KEY": ADMIN,
        "ONJOB_COLLECTOR__BUCKET": bucket_url,
        "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": s3_endpoint,
        "ONJOB_COLLECTOR__ROTATE_S": "0.5",
        "ONJOB_COLLECTOR__HOST_LEASE_S": "8",  # well past a round on a loaded machine
    }
    loader = ServerProcess(
        ["--engine-url", fake_engine_url, "--db", str(tmp_path / "loader" / "onjob.duckdb")],
        env=env,
        log=tmp_path / "loader.log",
    )

    def host(name: str) -> ServerProcess:
        (tmp_path / name).mkdir(exist_ok=True)
        db = str(tmp_path / name / "onjob.duckdb")
        return ServerProcess(
            ["--engine-url", fake_engine_url, "--db", db, "--primary", loader.base],
            env={**env, "ONJOB_COLLECTOR__HOST_ID": f"host-{name}"},
            log=tmp_path / f"{name}.log",
        )

    (tmp_path / "loader").mkdir()
    loader.start()
    a, b = host("a"), host("b")
    procs = [loader, a, b]
    try:
        a.start()
        b.start()
        clients = {
            p: OpenAI(base_url=p.url, api_key="unused", max_retries=0, timeout=60) for p in (a, b)
        }
        # Conversations whose turns alternate between the hosts: one trajectory each.
        answered: list[str] = []
        for c in range(6):
            messages = [SYSTEM, {"role": "user", "content": f"conversation {c}"}]
            for turn in range(4):
                reply = clients[(a, b)[(c + turn) % 2]].chat.completions.create(
                    model="agent", messages=messages, max_tokens=3
                )
                answered.append(reply.id)
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": f"and then {turn}?"},
                ]
        wait_for(loader, set(answered))
        assert collector_of(loader)["hosts_live"] == ["host-a", "host-b"]
        assert not list((tmp_path / "a" / "onjob.duckdb.spool").glob("*.jsonl"))  # handed over
        # The primary's routing reaches each host's spool, where its proxy follows it.
        routing = (tmp_path / "loader" / "onjob.duckdb.spool" / "routing.json").read_bytes()
        deadline = time.monotonic() + 30
        for name in ("a", "b"):
            mirrored = tmp_path / name / "onjob.duckdb.spool" / "routing.json"
            while not mirrored.exists() or mirrored.read_bytes() != routing:
                assert time.monotonic() < deadline, f"routing.json never reached host {name}"
                time.sleep(0.05)

        # Host b dies with answers in its open segment. It closes one every 0.5 s: should
        # the kill come just after a closing, b starts again and is killed again.
        on_b: list[str] = []
        for attempt in range(5):
            on_b += [ask(clients[b], f"b before its death {attempt}.{i}") for i in range(5)]
            b.kill()
            spool_b = tmp_path / "b" / "onjob.duckdb.spool"
            if any(p.stat().st_size > 0 for p in spool_b.glob("*.part")):
                break
            b = procs[2] = host("b").start()
            clients[b] = OpenAI(base_url=b.url, api_key="unused", max_retries=0, timeout=60)
        else:
            raise AssertionError("every kill came just after b closed its segment")
        # Its watermark holds the others back only until its lease runs out.
        on_a = [ask(clients[a], f"a while b is dead {i}") for i in range(5)]
        have = wait_for(loader, set(on_a))
        assert on_b[-1] not in have  # on b's disk alone
        assert collector_of(loader)["hosts_live"] == ["host-a"]
        # b starts again on its spool: the segment it had open goes to the loader.
        b = host("b")
        procs[2] = b
        b.start()
        on_b_again = [ask(OpenAI(base_url=b.url, api_key="unused"), "b again")]
        wait_for(loader, set(on_b + on_b_again))
    finally:
        for p in reversed(procs):
            p.stop()

    everything = answered + on_b + on_a + on_b_again
    db = tmp_path / "loader" / "onjob.duckdb"
    logged = rows(db, "SELECT id FROM exchanges")
    assert sorted(r["id"] for r in logged) == sorted(everything)  # each exactly once
    stitched = rows(
        db,
        "SELECT list(id ORDER BY turn) AS ids, list(turn ORDER BY turn) AS turns "
        "FROM exchanges WHERE list_contains(?, id) GROUP BY trajectory_id",
        [answered],
    )
    assert sorted(r["ids"] for r in stitched) == sorted(
        answered[c * 4 : c * 4 + 4] for c in range(6)
    )
    assert all(r["turns"] == [0, 1, 2, 3] for r in stitched)
    # Nothing set aside; no segment or watermark left once every host stopped cleanly.
    assert not list((tmp_path / "loader" / "onjob.duckdb.spool" / "failed").glob("*"))
    left = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint).list()
    # The loader's copy of its database, made at its clean stop, holds every segment it
    # loaded: none is left archived.
    kinds = {o.key.split("/")[0] for o in left}
    assert kinds == {"fetched", "routing.json", "loader.lease", "db"}
    assert len(left) == len({o.key for o in left})


def test_a_host_id_unfit_for_a_key_is_refused_at_start(tmp_path, fake_engine_url):
    bad = ServerProcess(
        ["--engine-url", fake_engine_url, "--db", str(tmp_path / "onjob.duckdb")],
        env={
            "ONJOB_COLLECTOR__BUCKET": f"s3://b-{uuid.uuid4().hex[:8]}",
            "ONJOB_COLLECTOR__HOST_ID": "../other",
        },
        log=tmp_path / "bad.log",
    )
    try:
        with pytest.raises(RuntimeError, match="host_id"):  # it exits: settings refused
            bad.start()
    finally:
        bad.stop()


def _segment(spool, line: bytes = b'{"kind": "x"}') -> None:
    spool.append(line)
    spool.rotate()


def test_a_host_that_cannot_reach_the_bucket_keeps_its_segments_until_it_can(
    tmp_path,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    from onjob.bucket import BucketError
    from onjob.collector.handoff import Fetcher, Uploader
    from onjob.collector.spool import Spool

    spool = Spool(tmp_path / "host")
    _segment(spool)
    _segment(spool)
    nowhere = Bucket.from_url(bucket_url, endpoint_url=f"http://127.0.0.1:{free_port()}")
    nowhere._client.meta.config.retries = {"max_attempts": 1}
    with pytest.raises(BucketError):
        Uploader(spool.directory, nowhere, "host-a").upload()
    assert len(list(spool.directory.glob("*.jsonl"))) == 2  # nothing lost

    bucket = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)
    mark = Uploader(spool.directory, bucket, "host-a").upload()
    assert mark is not None and not list(spool.directory.glob("*.jsonl"))
    loader = tmp_path / "loader"
    loader.mkdir()
    fetcher = Fetcher(loader, bucket, lease_s=60, holder="loader-1")
    try:
        remote = fetcher.fetch()
        assert remote.fetched == 2 and remote.live == ("host-a",)
        # On the loader's clock, at the earliest the two measures of the clocks allow (one
        # machine's here: the first measure of each is a second wide at most).
        assert mark.holds_from - 2_100 <= remote.before <= mark.holds_from
        assert len(list(loader.glob("*.jsonl"))) == 2
        assert fetcher.fetch().fetched == 0  # moved, not copied
        assert len(bucket.list("fetched/")) == 2
        assert fetcher.prune(3600) == 0  # young tombstones stay
        assert fetcher.prune(-1) == 2 and bucket.list("fetched/") == []
    finally:
        fetcher.close()


def test_what_is_not_a_segment_or_a_watermark_in_the_bucket_is_left_alone(
    tmp_path,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    from onjob.collector.handoff import Fetcher

    bucket = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)
    bucket.put_bytes("segments/x/etc/passwd.jsonl", b"junk")
    bucket.put_bytes("segments/not-a-segment.jsonl", b"junk")
    bucket.put_bytes("hosts/evil.json", b"{not json")
    fetcher = Fetcher(tmp_path, bucket, lease_s=60, holder="loader-1")
    try:
        remote = fetcher.fetch()
    finally:
        fetcher.close()
    assert remote.fetched == 0 and remote.live == () and remote.before is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loader.lock"]
    assert len(bucket.list("segments/")) == 2  # left for a person to look at


def test_a_deletion_reaches_the_hosts_so_the_next_turn_of_a_forgotten_conversation_is_kept(
    tmp_path,
    fake_engine_url,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    # A host stores a turn against its previous one (linear storage); once that one is
    # deleted the turn could not be rebuilt and would be dropped at load, so the host
    # must forget its memory of the conversation, as processes sharing a spool do.
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__ADMIN_KEY": ADMIN,
        "ONJOB_COLLECTOR__BUCKET": bucket_url,
        "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": s3_endpoint,
        "ONJOB_COLLECTOR__ROTATE_S": "0.3",
    }
    (tmp_path / "loader").mkdir()
    (tmp_path / "a").mkdir()
    loader = ServerProcess(
        ["--engine-url", fake_engine_url, "--db", str(tmp_path / "loader" / "onjob.duckdb")],
        env=env,
        log=tmp_path / "loader.log",
    )
    with loader:
        db = str(tmp_path / "a" / "onjob.duckdb")
        host = ServerProcess(
            ["--engine-url", fake_engine_url, "--db", db, "--primary", loader.base],
            env={**env, "ONJOB_COLLECTOR__HOST_ID": "host-a"},
            log=tmp_path / "a.log",
        )
        with host:
            client = OpenAI(base_url=host.url, api_key="unused", max_retries=0, timeout=60)
            messages = [SYSTEM, {"role": "user", "content": "Where is my order?"}]
            first = client.chat.completions.create(model="agent", messages=messages)
            wait_for(loader, {first.id})
            trajectory = rows_of(
                loader, f"SELECT trajectory_id FROM exchanges WHERE id = '{first.id}'"
            )
            forgot = httpx.post(
                f"{loader.base}/admin/forget",
                json={"trajectory": trajectory[0][0]},
                headers=AS_ADMIN,
                timeout=60,
            )
            assert forgot.status_code == 200, forgot.text
            assert first.id not in loaded_ids(loader)
            deadline = time.monotonic() + 30
            while collector_of(host)["forgets_seen"] < 1:
                assert time.monotonic() < deadline, "the host never saw the deletion"
            messages += [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And when will it arrive?"},
            ]
            second = client.chat.completions.create(model="agent", messages=messages)
            wait_for(loader, {second.id})


def test_a_loader_whose_bucket_is_down_serves_and_loads_once_it_is_back(tmp_path, fake_engine_url):
    import boto3

    port = free_port()  # nothing listens there yet
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__ADMIN_KEY": ADMIN,
        "ONJOB_COLLECTOR__BUCKET": "s3://later/onjob",
        "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": endpoint,
        **CREDENTIALS,
    }
    loader = ServerProcess(
        ["--engine-url", fake_engine_url, "--db", str(tmp_path / "onjob.duckdb")],
        env=env,
        log=tmp_path / "loader.log",
    )
    moto = None
    try:
        loader.start()
        answered = ask(OpenAI(base_url=loader.url, api_key="unused", max_retries=0), "hello")
        moto = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                boto3.client("s3", endpoint_url=endpoint, **AWS).create_bucket(Bucket="later")
                break
            except Exception:
                assert time.monotonic() < deadline, "moto did not start"
                time.sleep(0.1)
        wait_for(loader, {answered})
    finally:
        loader.stop()
        if moto is not None:
            moto.terminate()
            moto.wait()
    assert "cannot read collector.bucket" in (tmp_path / "loader.log").read_text()


def test_a_host_stopping_during_a_hand_off_round_still_deletes_its_watermark(
    tmp_path,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    """A round's thread outlives the cancelled task that awaited it: the clean stop waits
    for it, then retires, so the loader is not held back until the host's lease runs out."""
    import asyncio
    import threading

    from onjob.collector.settings import CollectorSettings
    from onjob.collector.writer import Collector

    settings = CollectorSettings(
        db=tmp_path / "onjob.duckdb",
        rotate_s=0.05,
        bucket=bucket_url,
        bucket_endpoint_url=s3_endpoint,
        host_id="host-a",
    )
    in_round, go_on = threading.Event(), threading.Event()

    def hold_the_first_watermark(request, **_) -> None:
        # boto3's own hook, at the HTTP boundary: the first watermark's PUT waits.
        if "/hosts/" in request.url and not go_on.is_set():
            in_round.set()
            go_on.wait(30)

    async def scenario() -> bool:
        collector = Collector(settings, load=False)
        await collector.start()
        collector._bucket._client.meta.events.register(
            "before-send.s3.PutObject", hold_the_first_watermark
        )
        assert await asyncio.to_thread(in_round.wait, 30), "no hand-off round started"
        closing = asyncio.create_task(collector.close())
        done, _ = await asyncio.wait({closing}, timeout=1)
        go_on.set()
        await closing
        return not done

    waited = asyncio.run(scenario())
    assert waited  # the stop waited for the round in flight
    left = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint).list()
    assert [o.key for o in left if "/hosts/" in f"/{o.key}"] == []


def test_chains_and_feedback_sent_at_once_through_other_hosts_reach_the_loader(
    tmp_path,
    fake_engine_url,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    """At default settings (a hand-off round a second), a chained Responses call and
    feedback sent the moment the answer came back, to the host that answered or to the
    other: the loader waits for the exact answer they name (`proxy.lookup_wait_s`)."""
    env = bucket_env(bucket_url, s3_endpoint, proxy__admin_key=ADMIN)  # else the defaults
    loader = server_in(tmp_path, "loader", fake_engine_url, env)

    def host(name: str) -> ServerProcess:
        return server_in(tmp_path, name, fake_engine_url, env, "--primary", loader.base)

    procs = [loader.start()]
    try:
        a, b = host("a").start(), host("b").start()
        procs += [a, b]
        clients = [
            OpenAI(base_url=p.url, api_key="unused", max_retries=0, timeout=60) for p in (a, b)
        ]

        def chain(c: int) -> tuple[list[float], list[str]]:
            """One conversation of 11 answers, 10 chained; each chained call and each
            feedback sent at once, half to the other host."""
            took, errors = [], []
            reply = clients[c % 2].responses.create(model="agent", input=f"start {c}")
            for turn in range(10):
                there = clients[(c + turn) % 2]  # the host that answered, or the other
                start = time.monotonic()
                try:
                    reply = there.responses.create(
                        model="agent",
                        input=f"and then {turn}?",
                        previous_response_id=reply.id,
                        max_output_tokens=3,
                    )
                except Exception as exc:  # counted, not raised: the test says how many
                    errors.append(f"{type(exc).__name__}: {exc}")
                    break
                took.append(time.monotonic() - start)
                answer = httpx.post(
                    f"{clients[(c + turn + 1) % 2].base_url}feedback",
                    json={"exchange_id": reply.id, "value": 1.0},
                    timeout=60,
                )
                if answer.status_code != 200:
                    errors.append(f"feedback: {answer.status_code} {answer.text}")
            return took, errors

        with ThreadPoolExecutor(10) as pool:
            results = list(pool.map(chain, range(10)))
    finally:
        for p in reversed(procs):
            p.stop()
    took = sorted(t for r in results for t in r[0])
    errors = [e for r in results for e in r[1]]
    assert errors == [] and len(took) == 100
    print(f"chained calls: median {took[50]:.2f} s, p90 {took[90]:.2f} s, max {took[-1]:.2f} s")
    db = tmp_path / "loader" / "onjob.duckdb"
    chains = rows(db, "SELECT count(DISTINCT trajectory_id) AS n, count(*) AS turns FROM exchanges")
    assert chains == [{"n": 10, "turns": 110}]  # each conversation one trajectory
    assert rows(db, "SELECT count(*) AS n FROM feedback") == [{"n": 100}]
