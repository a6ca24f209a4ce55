"""`GET /metrics` (`proxy/metrics.py`, `deploy/metrics.py`), read back with
`prometheus_client`'s own parser: each exchange counted by lineage, arm and status with its
latency, a failed canary once per arm, the engines, the routing, the spool and the loop
read at the scrape; the door (the metrics key or the admin key, nothing else); a real
`onjob serve`, and through its workers, which forward the scrape to the primary."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings
from onjob.proxy import ProxySettings, create_app
from onjob.proxy.metrics import DURATION_BUCKETS_S, Metrics

from .fake_engine import chunk, completion, scripted

ADMIN = "adm-3b9e1f"
METRICS = "mtr-7c2d4a"
LOCAL = "http://127.0.0.1"  # the Host /metrics answers, as the admin API does (`auth.py`)
CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hello"}]}


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape, by its name and labels, parsed as Prometheus would."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def one(scraped: dict, name: str, **labels: str) -> float:
    return scraped[(name, frozenset(labels.items()))]


def engine(request: httpx.Request) -> httpx.Response:
    """Answers as the model it was asked for, streamed when asked; the canary fails (500) on
    a message that says "break"."""
    body = json.loads(request.content)
    model = body["model"]
    if model == "ckpt-b" and body["messages"][-1]["content"] == "break":
        return httpx.Response(500, json={"error": {"message": "boom", "type": "x", "code": 500}})
    if body.get("stream"):
        said = chunk("hi", finish="stop").replace(b'"fake"', json.dumps(model).encode())

        async def events():
            yield said + b"data: [DONE]\n\n"

        return httpx.Response(200, content=events())
    return httpx.Response(200, json=completion(model=model))


def app_for(tmp_path, metrics: Metrics | None):
    settings = ProxySettings(
        aliases={"agent": ""},  # live: the engine's base model, `fake`
        canaries={"agent": {"checkpoint": "ckpt-b", "fraction": 0.3}},
        admin_key=ADMIN,
        metrics_key=METRICS,
    )
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    return create_app(settings, upstream=scripted(engine), collector=collector, metrics=metrics)


def ask(client, content: str, arm: str, **fields) -> httpx.Response:
    messages = [{"role": "user", "content": content}]
    reply = client.post(
        "/v1/chat/completions",
        json={"model": "agent", "messages": messages, **fields},
        headers={"X-Onjob-Arm": arm},
    )
    assert reply.status_code == 200, reply.text
    return reply


def test_each_exchange_is_counted_by_lineage_arm_and_status_with_its_latency(tmp_path):
    with TestClient(app_for(tmp_path, Metrics()), base_url=LOCAL) as client:
        for i in range(3):
            ask(client, f"live {i}", "live")
        ask(client, "live streamed", "live", stream=True)
        for i in range(2):
            ask(client, f"canary {i}", "canary")
        # The canary fails; live answers in its place: one exchange per arm.
        assert ask(client, "break", "canary").headers["x-onjob-arm"] == "live"
        reply = client.get("/metrics", headers=bearer(ADMIN))
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    scraped = samples(reply.text)

    requests = "onjob_requests_total"
    assert one(scraped, requests, alias="agent", arm="live", status="200") == 5
    assert one(scraped, requests, alias="agent", arm="canary", status="200") == 2
    assert one(scraped, requests, alias="agent", arm="canary", status="500") == 1
    for arm, count in (("live", 5), ("canary", 3)):
        hist = "onjob_request_duration_seconds"
        assert one(scraped, f"{hist}_count", alias="agent", arm=arm) == count
        assert one(scraped, f"{hist}_bucket", alias="agent", arm=arm, le="+Inf") == count
        buckets = [
            one(scraped, f"{hist}_bucket", alias="agent", arm=arm, le=str(le))
            for le in DURATION_BUCKETS_S
        ]
        assert buckets == sorted(buckets) and buckets[-1] == count  # none took 2 min
        assert 0 < one(scraped, f"{hist}_sum", alias="agent", arm=arm) < 120 * count

    # Read at the scrape: the engine, the routing, the spool.
    assert one(scraped, "onjob_engine_requests_in_flight", engine="http://engine/v1") == 0
    assert one(scraped, "onjob_engine_state", engine="http://engine/v1", state="up") == 1
    assert one(scraped, "onjob_engine_state", engine="http://engine/v1", state="down") == 0
    assert one(scraped, "onjob_canary_fraction", alias="agent") == 0.3
    assert one(scraped, "onjob_routing_info", alias="agent", live="", canary="ckpt-b") == 1
    assert one(scraped, "onjob_collector_spooled_total") == 8
    assert one(scraped, "onjob_spool_backlog_segments") >= 0
    assert one(scraped, "onjob_spool_backlog_bytes") >= 0
    assert any(name == "process_resident_memory_bytes" for name, _ in scraped)


def test_two_apps_in_one_process_count_apart(tmp_path):
    first, second = Metrics(), Metrics()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        TestClient(app_for(tmp_path / "a", first), base_url=LOCAL) as a,
        TestClient(app_for(tmp_path / "b", second), base_url=LOCAL),
    ):
        ask(a, "only here", "live")
        scraped = samples(a.get("/metrics", headers=bearer(METRICS)).text)
    assert one(scraped, "onjob_requests_total", alias="agent", arm="live", status="200") == 1
    assert not samples(second.scrape(None)[0].decode()).get(
        ("onjob_requests_total", frozenset({"alias": "agent", "arm": "live", "status": "200"}))
    )


def test_the_metrics_door_takes_the_metrics_key_or_the_admin_key_and_nothing_else(tmp_path):
    with TestClient(app_for(tmp_path, Metrics()), base_url=LOCAL) as client:
        for key in (METRICS, ADMIN):
            assert client.get("/metrics", headers=bearer(key)).status_code == 200
        basic = {"Authorization": "Basic " + base64.b64encode(f"me:{ADMIN}".encode()).decode()}
        for refused in ({}, bearer("mtr-wrong"), basic):
            reply = client.get("/metrics", headers=refused)
            assert reply.status_code == 401, (refused, reply.text)
            assert reply.json()["error"]["type"] == "authentication_error"
            assert "onjob_" not in reply.text
        foreign = client.get("/metrics", headers={"Origin": "http://evil.example", **bearer(ADMIN)})
        assert foreign.status_code == 403
    with TestClient(
        app_for(tmp_path, None), base_url=LOCAL
    ) as client:  # an app that counts nothing
        assert client.get("/metrics", headers=bearer(ADMIN)).status_code == 404


@pytest.fixture(scope="module")
def server(tmp_path_factory, fake_engine_url):
    """A real `onjob serve` with a metrics key (and the admin key it makes itself)."""
    where = tmp_path_factory.mktemp("metrics")
    args = ["--engine-url", fake_engine_url, "--db", str(where / "onjob.duckdb")]
    env = {"ONJOB_PROXY__METRICS_KEY": METRICS, "ONJOB_PROXY__ADMIN_KEY": ADMIN}
    with ServerProcess(args, env=env, log=where / "server.log") as proc:
        yield proc


def test_a_real_server_counts_its_exchanges_and_shows_its_loop(server):
    for i in range(2):
        answer = httpx.post(
            f"{server.url}/chat/completions",
            json={**CHAT, "messages": [{"role": "user", "content": f"q{i}"}]},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    reply = httpx.get(f"{server.base}/metrics", headers=bearer(ADMIN), timeout=30)
    assert reply.status_code == 200, reply.text
    scraped = samples(reply.text)
    labels = {"alias": "agent", "arm": "live"}
    assert one(scraped, "onjob_requests_total", status="200", **labels) == 2
    assert one(scraped, "onjob_request_duration_seconds_count", **labels) == 2
    assert one(scraped, "onjob_loop_enabled") == 1  # every 300 s in tests (conftest.py)
    assert one(scraped, "onjob_loop_paused") == 0
    assert one(scraped, "onjob_loop_stage", stage="idle") == 1
    assert one(scraped, "onjob_loop_iterations_total") == 0
    assert one(scraped, "onjob_canary_fraction", alias="agent") == 0
    engines = [labels for (name, labels) in scraped if name == "onjob_engine_requests_in_flight"]
    assert len(engines) == 1


def test_a_real_servers_metrics_key_opens_metrics_alone(server):
    assert httpx.get(f"{server.base}/metrics", headers=bearer(METRICS)).status_code == 200
    refused = httpx.get(f"{server.base}/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{server.base}/admin/status", headers=bearer(METRICS)).status_code == 401
    assert httpx.get(f"{server.base}/dashboard", headers=bearer(METRICS)).status_code == 401


def test_workers_forward_the_scrape_to_the_primary(tmp_path, fake_engine_url):
    """With the loader apart only workers answer traffic; every scrape reaches the primary
    through one of them, which counted no exchange itself, and the loaded exchanges count
    all of them (docs/metrics.md)."""
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", fake_engine_url, "--db", str(db), "--workers", "2", "--loader-apart"]
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": ADMIN}
    env["ONJOB_PROXY__METRICS_KEY"] = METRICS
    with ServerProcess(args, env=env, log=tmp_path / "server.log") as server:
        for i in range(6):
            answer = httpx.post(
                f"{server.url}/chat/completions",
                json={**CHAT, "messages": [{"role": "user", "content": f"w{i}"}]},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
        # The admin API loads the spool first: what the workers spooled is in DuckDB.
        sql = {"query": "SELECT count(*) FROM exchanges"}
        loaded = httpx.post(f"{server.base}/admin/sql", json=sql, headers=bearer(ADMIN))
        assert loaded.json()["rows"] == [[6]]
        for _ in range(4):  # a new connection each time: the kernel picks a worker
            reply = httpx.get(f"{server.base}/metrics", headers=bearer(METRICS), timeout=30)
            assert reply.status_code == 200, reply.text
            scraped = samples(reply.text)
            assert not [name for name, _ in scraped if name == "onjob_requests_total"]
            assert one(scraped, "onjob_collector_loaded_total") == 6
            assert one(scraped, "onjob_loop_enabled") == 0
