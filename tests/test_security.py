"""Security of a real `onjob serve` with API keys and an admin key: the admin API and the
dashboard open only to the admin key, one API key cannot post feedback on another key's
exchanges or conversations, no secret reaches the log, the spool or the database, and the
body size and `n` are bounded. The engine is onjob/testing/fake_upstream.py, a real process."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import duckdb
import httpx
import openai
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.cli.settings import ServeSettings
from onjob.dashboard import pages
from onjob.deploy import admin
from onjob.proxy import ProxySettings

from .conftest import admin_of

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"alice": "sk-alice-7f3a91c2e5", "bob": "sk-bob-0d8e44b6a1"}
ADMIN = "adm-5c1e9b7d42f0"
WRONG = "sk-wrong-b84c2a9e"
SECRETS = [*KEYS.values(), ADMIN, WRONG]
MAX_BODY = 64 * 1024
CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hello"}]}


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def basic(password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{password}".encode()).decode()}


def handlers(routers) -> list[tuple[str, str]]:
    """(method, path) of each route, with a placeholder in path parameters (OPTIONS and
    HEAD, which Litestar answers itself, left out)."""
    return [
        (method, route.path.split("{")[0] + ("x" if "{" in route.path else ""))
        for router in routers
        for route in router.routes
        for method in sorted(route.methods - {"OPTIONS", "HEAD"})
    ]


ADMIN_ROUTES = handlers(admin.routes(ServeSettings(), None, None, None))
DASHBOARD_PAGES = handlers(pages.routes(ServeSettings(), None, None))


@pytest.fixture(scope="module")
def engine_url(fake_engine_url):
    return fake_engine_url  # the shared canned engine (conftest.py)


def serve(tmp_path: Path, engine_url: str, *, admin: bool = True, **env: str) -> ServerProcess:
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__API_KEYS": json.dumps(KEYS),
        "ONJOB_PROXY__MAX_BODY_BYTES": str(MAX_BODY),
        **({"ONJOB_PROXY__ADMIN_KEY": ADMIN} if admin else {}),
        **env,
    }
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine_url, "--db", str(db)]
    return ServerProcess(args, env=env, log=tmp_path / "server.log")


@pytest.fixture(scope="module")
def server(tmp_path_factory, engine_url):
    with serve(tmp_path_factory.mktemp("security"), engine_url) as proc:
        yield proc


def test_every_route_is_listed():
    assert ("GET", "/admin/status") in ADMIN_ROUTES and len(ADMIN_ROUTES) >= 6
    assert ("GET", "/dashboard") in DASHBOARD_PAGES and len(DASHBOARD_PAGES) >= 7


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_admin_routes_open_only_to_the_admin_key(server, method, path):
    def call(headers: dict) -> httpx.Response:
        return httpx.request(method, server.base + path, headers=headers, json={}, timeout=30)

    # Basic auth is the dashboard's alone: a browser sends what it cached for a page
    # along with any site's form post, so the admin API never takes it.
    for refused in ({}, bearer(KEYS["alice"]), bearer(WRONG), basic(KEYS["bob"]), basic(ADMIN)):
        reply = call(refused)
        assert reply.status_code == 401, (refused, reply.text)
        assert reply.json()["error"]["type"] == "authentication_error"
    # With the key, the route runs: a GET answers, a POST judges its (empty) body.
    assert call(bearer(ADMIN)).status_code == (200 if method == "GET" else 400)


@pytest.mark.parametrize(("method", "path"), DASHBOARD_PAGES)
def test_dashboard_pages_open_only_to_the_admin_key(server, method, path):
    def call(headers: dict) -> httpx.Response:
        return httpx.request(method, server.base + path, headers=headers, timeout=30)

    for refused in ({}, basic(KEYS["alice"]), bearer(KEYS["bob"]), basic(WRONG)):
        reply = call(refused)
        assert reply.status_code == 401, (refused, reply.text)
        assert reply.headers["WWW-Authenticate"].startswith("Basic")
        assert "<html" not in reply.text.lower()
    # Detail pages of an unknown id (and a missing asset) are a 404, behind the key like
    # the rest; the key works as a Bearer token too.
    # A POST (the buttons') takes JSON only, so no other site's form can send one.
    for key in (basic(ADMIN), bearer(ADMIN)):
        expected = 404 if path.endswith("/x") else 200 if method == "GET" else 415
        assert call(key).status_code == expected


def test_with_api_keys_and_no_admin_key_the_admin_key_is_made_beside_the_database(
    tmp_path, engine_url
):
    with serve(tmp_path, engine_url, admin=False) as server:
        made = admin_of(tmp_path / "onjob.duckdb")
        for method, path in ADMIN_ROUTES:
            for headers in ({}, bearer(KEYS["alice"])):
                reply = httpx.request(method, server.base + path, headers=headers, json={})
                assert reply.status_code == 401, (path, reply.text)
        assert httpx.get(f"{server.base}/admin/status", headers=made).status_code == 200
        for method, path in DASHBOARD_PAGES:
            reply = httpx.request(method, server.base + path, headers=basic(KEYS["alice"]))
            assert reply.status_code == 401, (path, reply.text)


def test_the_openapi_document_needs_an_api_key_as_the_model_list_does(server):
    assert httpx.get(f"{server.base}/openapi.json").status_code == 401
    doc = httpx.get(f"{server.base}/openapi.json", headers=bearer(KEYS["bob"])).json()
    assert doc["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert set(doc["paths"]) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/input_items",
        "/v1/models",
        "/v1/models/{model}",
        "/v1/feedback",
        "/health",
    }


def test_health_tells_anyone_the_server_is_up_and_only_the_admin_key_its_counters(server):
    """The counters (every tenant's traffic through this process) were an API key's too."""
    anonymous = httpx.get(f"{server.base}/health")
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ok"}
    for secret in (WRONG, KEYS["bob"]):  # a wrong key, or a tenant's, learns no more
        assert httpx.get(f"{server.base}/health", headers=bearer(secret)).json() == anonymous.json()
    admin = httpx.get(f"{server.base}/health", headers=bearer(ADMIN)).json()
    assert admin["status"] == "ok" and admin["pid"] > 0 and admin["engines"] == ["up"]
    assert "spooled" in admin["collector"]
    foreign = httpx.get(f"{server.base}/health", headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and "another site" in foreign.json()["error"]["message"]


def test_one_key_cannot_see_delete_or_continue_another_keys_stored_response(server):
    made = httpx.post(
        f"{server.url}/responses",
        json={"model": "agent", "input": "hello", "max_output_tokens": 2},
        headers=bearer(KEYS["alice"]),
    )
    assert made.status_code == 200, made.text
    hers, absent = made.json()["id"], "resp_00000000000000000000000000000000"
    calls = [
        lambda rid: httpx.get(f"{server.url}/responses/{rid}", headers=bearer(KEYS["bob"])),
        lambda rid: httpx.get(
            f"{server.url}/responses/{rid}/input_items", headers=bearer(KEYS["bob"])
        ),
        lambda rid: httpx.delete(f"{server.url}/responses/{rid}", headers=bearer(KEYS["bob"])),
        lambda rid: httpx.post(
            f"{server.url}/responses",
            json={"model": "agent", "input": "go on", "previous_response_id": rid},
            headers=bearer(KEYS["bob"]),
        ),
    ]
    for call in calls:
        reply, twin = call(hers), call(absent)
        # Answered exactly as an id that does not exist: nothing tells that it does.
        assert reply.status_code == twin.status_code == 404, reply.text
        assert reply.text.replace(hers, absent) == twin.text
    assert httpx.get(f"{server.url}/responses/{hers}", headers=bearer(KEYS["alice"])).is_success


def test_one_key_cannot_post_feedback_on_another_keys_exchange_or_conversation(server):
    def chat(key: str, trajectory: str) -> str:
        headers = {**bearer(KEYS[key]), "X-Onjob-Trajectory": trajectory}
        reply = httpx.post(f"{server.url}/chat/completions", json=CHAT, headers=headers)
        assert reply.status_code == 200, reply.text
        return reply.json()["id"]

    def feedback(key: str, **ids: str) -> httpx.Response:
        body = {"value": 1, **ids}
        return httpx.post(f"{server.url}/feedback", json=body, headers=bearer(KEYS[key]))

    alices = chat("alice", "conv-alice")
    bobs = chat("bob", "conv-bob")
    # bob names alice's conversation: his own conversation of that name, hers stays hers.
    bobs_own = chat("bob", "conv-alice")
    hers = "alice:conv-alice"  # its id in the database: no name of bob's reaches it
    for foreign, absent, ids in (
        (alices, "chatcmpl-none", {"exchange_id": alices}),
        (hers, "conv-none", {"trajectory_id": hers}),
        (hers, "conv-none", {"exchange_id": bobs, "trajectory_id": hers}),
    ):
        reply = feedback("bob", **ids)
        twin = feedback("bob", **{k: absent if v == foreign else v for k, v in ids.items()})
        # Answered exactly as an id that does not exist: nothing tells that it does.
        assert reply.status_code == twin.status_code == 404, (ids, reply.text)
        assert reply.text.replace(foreign, absent) == twin.text
    assert feedback("alice", exchange_id=alices).status_code == 200
    assert feedback("alice", trajectory_id="conv-alice").status_code == 200
    mine = feedback("bob", exchange_id=bobs, trajectory_id="conv-bob")
    assert mine.status_code == 200 and mine.json()["api_key_id"] == "bob"
    his = feedback("bob", exchange_id=bobs_own, trajectory_id="conv-alice")
    assert his.status_code == 200 and his.json()["trajectory_id"] == "bob:conv-alice"


def test_body_size_and_n_are_bounded_through_the_real_server(server):
    client = OpenAI(base_url=server.url, api_key=KEYS["alice"], max_retries=0, timeout=30)
    huge = [{"role": "user", "content": "x" * MAX_BODY}]
    with pytest.raises(openai.APIStatusError) as too_big:
        client.chat.completions.create(model="agent", messages=huge)
    assert too_big.value.status_code == 413
    too_many = ProxySettings().max_n + 1  # the default
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="agent", messages=CHAT["messages"], n=too_many)
    assert bad.value.param == "n"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="agent", messages=CHAT["messages"], max_tokens=10**9)
    assert bad.value.param == "max_tokens"
    reply = client.chat.completions.create(model="agent", messages=CHAT["messages"], n=2)
    assert reply.choices[0].message.content


def test_secrets_never_reach_the_log_the_spool_or_the_database(tmp_path, engine_url):
    marker = "marker-4b1d0e"  # what the client wrote must be found where secrets are not
    server = serve(tmp_path, engine_url, ONJOB_COLLECTOR__FLUSH_INTERVAL_S="3600").start()
    try:
        client = OpenAI(base_url=server.url, api_key=KEYS["alice"], max_retries=0, timeout=30)
        messages = [{"role": "user", "content": marker}]
        reply = client.chat.completions.create(model="agent", messages=messages)
        for _ in client.chat.completions.create(model="agent", messages=messages, stream=True):
            pass
        with pytest.raises(openai.AuthenticationError):  # refused, not written down
            OpenAI(base_url=server.url, api_key=WRONG, max_retries=0).models.list()
        # The admin key is the operator's credential on the OpenAI routes too (the one that
        # may pin any checkpoint), and is no more written down than an API key.
        OpenAI(base_url=server.url, api_key=ADMIN, max_retries=0).models.list()
        spooled = b"".join(p.read_bytes() for p in (tmp_path / "onjob.duckdb.spool").iterdir())
        assert marker.encode() in spooled
        body = {"exchange_id": reply.id, "value": 1, "comment": marker}
        posted = httpx.post(f"{server.url}/feedback", json=body, headers=bearer(KEYS["alice"]))
        assert posted.status_code == 200
        assert httpx.get(f"{server.base}/admin/status", headers=bearer(ADMIN)).status_code == 200
        assert httpx.get(f"{server.base}/admin/status", headers=bearer(WRONG)).status_code == 401
        spooled += b"".join(p.read_bytes() for p in (tmp_path / "onjob.duckdb.spool").iterdir())
    finally:
        server.stop()
    log = (tmp_path / "server.log").read_bytes()
    assert b"onjob serve: http://" in log
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("onjob.duckdb*") if p.is_file())
    text = database_text(tmp_path / "onjob.duckdb")
    assert marker in text and "alice" in text  # the key's id is kept, never its secret
    for secret in SECRETS:
        assert secret.encode() not in log + spooled + stored, secret
        assert secret not in text, secret


def database_text(db: Path) -> str:
    """Every value of every table, as text: the file itself may hold strings compressed."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        return "\n".join(
            str(con.execute(f'SELECT * FROM "{table}"').fetchall()) for table in tables
        )
    finally:
        con.close()
