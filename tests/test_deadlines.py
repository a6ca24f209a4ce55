"""A client cannot hold a connection by sending slowly: a request's headers and body each
have a deadline, and past `proxy.max_client_connections` a request gets a 503, while
ordinary clients go on being answered and logged. Against a real `onjob serve` (the
engine: onjob/testing/fake_upstream.py, a real process), raw sockets on loopback and a real
DuckDB file."""

from __future__ import annotations

import socket
import time
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

import duckdb
import httpx
import openai

from onjob.cli.process import ServerProcess


def serve(tmp_path: Path, engine_url: str, **proxy) -> ServerProcess:
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    env |= {f"ONJOB_PROXY__{k.upper()}": str(v) for k, v in proxy.items()}
    args = ["--engine-url", engine_url, "--db", str(tmp_path / "onjob.duckdb")]
    return ServerProcess(args, env=env, log=tmp_path / "server.log")


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a 30 s socket timeout raises)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def chat(url: str, text: str) -> str:
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    answer = client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": text}]
    )
    return answer.id


def test_half_sent_headers_and_a_short_body_are_cut_at_their_deadlines(tmp_path, fake_engine_url):
    with serve(tmp_path, fake_engine_url, header_timeout_s=1, body_timeout_s=1) as server:
        with closing(connect(server.base)) as half_headers, closing(connect(server.base)) as short:
            started = time.monotonic()
            half_headers.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            short.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model"'
            )
            # Meanwhile an ordinary client is answered.
            answered = chat(server.url, "while two connections stall")
            assert read_until_closed(half_headers).startswith(b"HTTP/1.1 408 ")
            assert read_until_closed(short) == b""
            # Well inside the 30 s socket timeout: the deadlines closed them, not the test.
            assert time.monotonic() - started < 15
        after = chat(server.url, "after the stalled ones were cut")
    log = (tmp_path / "server.log").read_text()
    assert "request's headers took over 1s" in log and "request's body took over 1s" in log
    con = duckdb.connect(str(tmp_path / "onjob.duckdb"), read_only=True)
    ids = {i for (i,) in con.execute("SELECT id FROM exchanges").fetchall()}
    con.close()
    assert ids == {answered, after}  # the cut requests were never answered, so not logged


def test_past_the_connection_limit_a_request_gets_503_until_connections_close(
    tmp_path, fake_engine_url
):
    limit = 3
    with serve(tmp_path, fake_engine_url, max_client_connections=limit) as server:
        held = [connect(server.base) for _ in range(limit - 1)]
        for sock in held:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # headers never finished
        refused = httpx.get(f"{server.base}/health", timeout=30)
        assert refused.status_code == 503
        for sock in held:
            sock.close()
        # Closed connections free their slots: a readiness-style probe until they have.
        deadline = time.monotonic() + 30
        while (answer := httpx.get(f"{server.base}/health", timeout=30)).status_code == 503:
            assert time.monotonic() < deadline, "slots were never freed"
        assert answer.status_code == 200
