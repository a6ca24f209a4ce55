"""Nothing answered is too big to log: a body just under `proxy.max_body_bytes` (16 MiB by
default), padded inside `metadata`, which the log stores again (a stored Response a third
time), is answered and found in DuckDB, through chat, legacy completions and the Responses
API, whole and streamed. DuckDB's default `maximum_object_size` read lines of up to 32 MiB
and set these aside, whole segments at a time. Against a real `onjob serve` with its
default caps, a vLLM-like engine on loopback and a real DuckDB file."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import duckdb
import httpx
import pytest

from onjob.cli.process import ServerProcess
from onjob.proxy.settings import ProxySettings

from .test_fuzz import VllmLike

CAP = ProxySettings().max_body_bytes
ROUTES = [
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("completions", {"prompt": "hi"}),
    ("responses", {"input": "hi"}),
]


@pytest.fixture
def engine_url():
    engine = ThreadingHTTPServer(("127.0.0.1", 0), VllmLike)
    engine.daemon_threads = True
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{engine.server_address[1]}/v1"
    engine.shutdown()
    engine.server_close()


def at_the_cap(body: dict, tag: str) -> bytes:
    """`body` with `metadata.pad` filling it to the byte just under the cap."""
    body = {"model": "agent", **body, "metadata": {"tag": tag, "pad": ""}}
    room = CAP - len(json.dumps(body, separators=(",", ":")).encode()) - 1
    body["metadata"]["pad"] = "x" * room
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) == CAP - 1
    return raw


def test_a_body_at_the_cap_is_answered_and_logged_on_every_route(tmp_path, engine_url):
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine_url, "--db", str(db)]
    sent = {}
    server = ServerProcess(args, env={"ONJOB_LOOP__INTERVAL_S": "0"}, log=tmp_path / "server.log")
    with server as s, httpx.Client(timeout=120) as client:
        for path, body in ROUTES:
            for stream in (False, True):
                tag = f"{path}-{'streamed' if stream else 'whole'}"
                raw = at_the_cap({**body, "stream": stream}, tag)
                headers = {"Content-Type": "application/json"}
                answer = client.post(f"{s.url}/{path}", content=raw, headers=headers)
                assert answer.status_code == 200, (tag, answer.text[:300])
                sent[tag] = answer
        # The whole Response, stored with its three copies, is retrieved from DuckDB.
        stored_id = sent["responses-whole"].json()["id"]
        stored = client.get(f"{s.url}/responses/{stored_id}")
        assert stored.status_code == 200, stored.text[:300]
        assert stored.json()["metadata"]["pad"] == "x" * len(stored.json()["metadata"]["pad"])
    con = duckdb.connect(str(db), read_only=True)
    logged = con.execute(
        "SELECT metadata->>'$.tag', status, length(metadata->>'$.pad') FROM exchanges"
    ).fetchall()
    con.close()
    assert sorted(tag for tag, _, _ in logged) == sorted(sent)
    assert all(status == 200 for _, status, _ in logged)
    assert all(pad > CAP - 300 for _, _, pad in logged)
    assert not (tmp_path / "onjob.duckdb.spool" / "failed").exists() or not any(
        (tmp_path / "onjob.duckdb.spool" / "failed").iterdir()
    )


def test_an_exchange_past_the_line_limit_is_logged_without_its_bodies_and_untrainable(
    tmp_path, engine_url
):
    """`collector.max_line_bytes` bounds what the loader must read (DuckDB needs about ten
    times a line's size in memory; past it a load fails every round). A longer exchange is
    still logged, with its status, its size in `error`, and kept out of training."""
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine_url, "--db", str(db)]
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_COLLECTOR__MAX_LINE_BYTES": str(1 << 20)}
    chat = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}
    with ServerProcess(args, env=env, log=tmp_path / "server.log") as s:
        small = httpx.post(f"{s.url}/chat/completions", json={**chat, "metadata": {"t": "s"}})
        big_body = {**chat, "metadata": {"t": "big", "pad": "x" * 700_000}}  # stored twice
        big = httpx.post(f"{s.url}/chat/completions", json=big_body, timeout=60)
        assert small.status_code == big.status_code == 200
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(
        con.execute(
            "SELECT id, (status, untrainable, error, request IS NULL) FROM exchanges"
        ).fetchall()
    )
    con.close()
    assert rows[small.json()["id"]] == (200, None, None, False)
    status, why, error, no_request = rows[big.json()["id"]]
    assert (status, why, no_request) == (200, "too_large", True)
    assert "past collector.max_line_bytes (1048576)" in error
