"""No open admin door (`proxy/auth.py`, `cli/admin_key.py`): a real `onjob serve` with no
keys configured makes an admin key at its first start (0600, beside the database, reused
after), answers no admin call without it, refuses what a web page sends (a cross-site form
post, a foreign `Host` through DNS rebinding, `text/plain`), the CLI finds the key by
itself; an API key pins only the checkpoints its alias serves; the dashboard refuses
before it runs a query. The engine is onjob/testing/fake_upstream.py, a real process."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from onjob.cli import admin_key
from onjob.cli.process import ServerProcess, free_port
from onjob.cli.settings import ServeSettings
from onjob.collector import Store
from onjob.dashboard import pages
from onjob.deploy.act import registry
from onjob.openai_handlers import HANDLERS
from onjob.proxy import ProxySettings
from onjob.proxy.auth import Doors

from .conftest import admin_of

SELECT = {"query": "SELECT count(*) AS n FROM exchanges"}
CHAT = {"model": "agent", "messages": [{"role": "user", "content": "hello"}]}


def basic(password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{password}".encode()).decode()}


def serve(tmp_path: Path, engine_url: str, **env: str) -> ServerProcess:
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine_url, "--db", str(db)]
    env = {"ONJOB_LOOP__INTERVAL_S": "0", **env}
    return ServerProcess(args, env=env, log=tmp_path / "server.log")


@pytest.fixture(scope="module")
def keyless(tmp_path_factory, fake_engine_url):
    """A server with no API keys and no admin key configured: the default."""
    where = tmp_path_factory.mktemp("keyless")
    with serve(where, fake_engine_url) as server:
        yield server, where / "onjob.duckdb"


def test_a_keyless_start_makes_a_0600_admin_key_and_admin_calls_need_it(tmp_path, fake_engine_url):
    db = tmp_path / "onjob.duckdb"
    with serve(tmp_path, fake_engine_url) as server:
        key = admin_key.read(db)
        assert key and key.startswith(admin_key.PREFIX)
        path = admin_key.path_for(db)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert key in server.output()  # said once, on stderr
        assert "no API keys: any local process may use the models" in server.output()
        # Where the dashboard is, in the form a browser opens.
        assert f"dashboard at {server.base}/dashboard" in server.output()
        for path_, method in [("/admin/status", "GET"), ("/admin/sql", "POST")]:
            for refused in ({}, {"Authorization": "Bearer sk-anything"}):
                reply = httpx.request(method, server.base + path_, json=SELECT, headers=refused)
                assert reply.status_code == 401, reply.text
                assert reply.json()["error"]["type"] == "authentication_error"
        assert httpx.get(f"{server.base}/dashboard").status_code == 401
        mine = {"Authorization": f"Bearer {key}"}
        assert httpx.post(f"{server.base}/admin/sql", json=SELECT, headers=mine).status_code == 200
        first_log = server.output()
    # The next start reuses the key, and does not say it again.
    with serve(tmp_path, fake_engine_url) as again:
        assert admin_key.read(db) == key
        said = again.output()[len(first_log) :]
        assert key not in said and str(path) in said
        assert httpx.get(f"{again.base}/admin/status", headers=mine).status_code == 200


def test_a_key_file_others_can_read_is_refused_at_start(tmp_path, fake_engine_url):
    path = admin_key.path_for(tmp_path / "onjob.duckdb")
    path.write_text("onjob-admin-leaked\n")
    path.chmod(0o644)
    with pytest.raises(RuntimeError, match="chmod 600"):
        serve(tmp_path, fake_engine_url).start()


def test_a_cross_site_form_post_is_refused(keyless):
    """What a page on any site can make a browser send: a `text/plain` form post, with the
    Basic credentials the browser cached for the dashboard."""
    server, db = keyless
    key = admin_key.read(db)
    port = server.base.rsplit(":", 1)[1]
    for headers in (
        {"Origin": "http://evil.example", **basic(key)},
        {"Origin": "http://evil.example", "Authorization": f"Bearer {key}"},
        {"Origin": "null", **basic(key)},  # a sandboxed frame, a file
        {"Origin": f"http://127.0.0.1:{int(port) + 1}", **basic(key)},  # another local page
    ):
        reply = httpx.post(
            f"{server.base}/admin/sql",
            content=json.dumps(SELECT),
            headers={"Content-Type": "text/plain", **headers},
        )
        assert reply.status_code in (401, 403), (headers, reply.text)
        assert "rows" not in reply.json()
    refused = httpx.post(
        f"{server.base}/admin/sql",
        json=SELECT,
        headers={"Origin": "http://evil.example", "Authorization": f"Bearer {key}"},
    )
    assert refused.status_code == 403
    assert "another site" in refused.json()["error"]["message"]
    # The same page's post to the OpenAI routes writes nothing to the log either.
    form = httpx.post(
        f"{server.url}/chat/completions",
        content=json.dumps(CHAT),
        headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    assert form.status_code == 403, form.text
    # The server's own page (same origin) is not refused.
    own = httpx.get(
        f"{server.base}/dashboard",
        headers={"Origin": server.base, "Authorization": f"Bearer {key}"},
    )
    assert own.status_code == 200


def test_a_foreign_host_is_refused(keyless):
    """DNS rebinding: a page's own name pointed at 127.0.0.1 arrives with that name as
    the Host, and its requests are then same-origin for the browser."""
    server, db = keyless
    mine = admin_of(db)
    port = server.base.rsplit(":", 1)[1]
    for path in ("/admin/status", "/dashboard", "/dashboard/static/dashboard.css"):
        reply = httpx.get(server.base + path, headers={**mine, "Host": f"evil.example:{port}"})
        assert reply.status_code == 403, (path, reply.text)
        assert "does not name this server" in reply.json()["error"]["message"]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", "127.0.0.1"):
            ok = httpx.get(server.base + path, headers={**mine, "Host": host})
            assert ok.status_code == 200, (path, host, ok.text)
    # The OpenAI routes: a browser's request (Fetch Metadata) is refused under such a name,
    # even same-origin as the rebinding makes it; a client that is not a browser is not.
    page = {
        "Host": f"evil.example:{port}",
        "Origin": f"http://evil.example:{port}",
        "Sec-Fetch-Site": "same-origin",
    }
    chat = {**CHAT, "messages": [{"role": "user", "content": "rebound-7c1e"}]}
    refused = httpx.post(f"{server.url}/chat/completions", json=chat, headers=page)
    assert refused.status_code == 403, refused.text
    assert "does not name this server" in refused.json()["error"]["message"]
    named = httpx.post(
        f"{server.url}/chat/completions", json=CHAT, headers={"Host": f"gpu-box:{port}"}
    )
    assert named.status_code == 200, named.text
    found = httpx.post(
        f"{server.base}/admin/sql",
        json={"query": "SELECT count(*) FROM exchanges_full WHERE request::VARCHAR LIKE '%7c1e%'"},
        headers=mine,
    )
    assert found.json()["rows"] == [[0]], found.text  # the refused request left no trace


def test_admin_posts_take_json_only(keyless):
    server, db = keyless
    mine = admin_of(db)
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None):
        headers = {**mine, **({"Content-Type": media} if media else {})}
        reply = httpx.post(f"{server.base}/admin/sql", content=json.dumps(SELECT), headers=headers)
        assert reply.status_code == 415, (media, reply.text)
        assert "application/json" in reply.json()["error"]["message"]
    for media in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        headers = {**mine, "Content-Type": media}
        reply = httpx.post(f"{server.base}/admin/sql", content=json.dumps(SELECT), headers=headers)
        assert reply.status_code == 200, (media, reply.text)


def test_the_cli_finds_the_key_a_keyless_server_made(keyless, tmp_path):
    server, db = keyless
    port = server.base.rsplit(":", 1)[1]
    env = {**os.environ, "ONJOB_PROXY__PORT": port}

    def onjob(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "onjob.cli", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    status = onjob("status", "--db", str(db))
    assert status.returncode == 0, status.stderr
    assert "no server answered" not in status.stdout
    sql = onjob("sql", "SELECT 41 + 1 AS answer", "--server", server.base, "--db", str(db))
    assert sql.returncode == 0 and "42" in sql.stdout, sql.stderr
    # Elsewhere (no key file beside that database) the server says what it needs, and the
    # command how to give it.
    elsewhere = onjob("status", "--db", str(tmp_path / "other.duckdb"))
    assert elsewhere.returncode == 2 and "admin key" in elsewhere.stderr
    assert "--admin-key" in elsewhere.stderr
    # Given on the command line, from a directory with neither onjob.toml nor the key file.
    key = admin_of(db)["Authorization"].removeprefix("Bearer ")
    given = ("--server", server.base, "--admin-key", key)
    status = onjob("status", *given)
    assert status.returncode == 0, status.stderr
    assert "no server answered" not in status.stdout and "agent: live base" in status.stdout
    sql = onjob("sql", "SELECT 41 + 1 AS answer", *given)
    assert sql.returncode == 0 and "42" in sql.stdout, sql.stderr
    assert not (tmp_path / "onjob.duckdb").exists()


def test_an_api_key_pins_only_what_its_alias_serves(tmp_path, fake_engine_url):
    keys = {"alice": "sk-alice-3b9d"}
    env = {
        "ONJOB_PROXY__API_KEYS": json.dumps(keys),
        "ONJOB_PROXY__ADMIN_KEY": "adm-71c0",
        "ONJOB_PROXY__ALIASES": json.dumps({"agent": "ckpt-live"}),
    }
    with serve(tmp_path, fake_engine_url, **env) as server:

        def chat(pin: str, key: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}", "X-Onjob-Arm": pin}
            return httpx.post(f"{server.url}/chat/completions", json=CHAT, headers=headers)

        for candidate in ("ckpt-candidate", "ckpt-rolled-back"):
            refused = chat(candidate, keys["alice"])
            assert refused.status_code == 403, refused.text
            assert "needs the admin key" in refused.json()["error"]["message"]
            # The admin key passes this door (what the engine then answers is its own).
            assert chat(candidate, "adm-71c0").status_code != 403
        # What the alias serves, by its arm or its name, passes (this engine has no adapters
        # loaded: the proxy's own 503 says so, after the door).
        for pin in ("live", "ckpt-live"):
            served = chat(pin, keys["alice"])
            assert served.status_code == 503, served.text
            assert "not loaded in the engine" in served.json()["error"]["message"]


def test_a_proxy_only_process_keeps_the_same_door(tmp_path, fake_engine_url):
    """With the loader apart, a worker answers every request on the port and forwards
    the admin API and the dashboard to the primary, which sees the worker's own Host: the
    worker refuses the page's Host and Origin itself, and knows the made admin key."""
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", fake_engine_url, "--db", str(db), "--workers", "1", "--loader-apart"]
    with ServerProcess(args, env={"ONJOB_LOOP__INTERVAL_S": "0"}) as server:
        mine = admin_of(db)
        port = server.base.rsplit(":", 1)[1]
        assert httpx.get(f"{server.base}/admin/status", headers=mine).status_code == 200
        assert httpx.get(f"{server.base}/admin/status").status_code == 401
        for path in ("/admin/status", "/dashboard"):
            foreign = httpx.get(
                server.base + path, headers={**mine, "Host": f"evil.example:{port}"}
            )
            assert foreign.status_code == 403, (path, foreign.text)
            page = httpx.get(server.base + path, headers={**mine, "Origin": "http://evil.example"})
            assert page.status_code == 403, (path, page.text)
        own = httpx.get(f"{server.base}/dashboard", headers={**mine, "Origin": server.base})
        assert own.status_code == 200, own.text
        pinned = {**mine, "X-Onjob-Arm": "ckpt-candidate"}
        candidate = httpx.post(f"{server.url}/chat/completions", json=CHAT, headers=pinned)
        assert candidate.status_code != 403, candidate.text  # the worker read the key file
        anyone = httpx.post(
            f"{server.url}/chat/completions", json=CHAT, headers={"X-Onjob-Arm": "ckpt-candidate"}
        )
        assert anyone.status_code == 403, anyone.text


def test_a_keyless_server_starting_its_engine_still_controls_its_adapters(
    tmp_path, tiny_model_dir, tiny_adapter_dir
):
    """The settings the made key is added to are the ones the server runs with: the adapter
    token it makes for its engine child reaches the operator that loads adapters."""
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, tiny_adapter_dir, "ckpt-door", tiny_model_dir)
    store.close()
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = ["--start-engine", "--engine-url", url, "--db", str(db)]
    args += ["--backend", "local", "--model", str(tiny_model_dir)]
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_ENGINE__ARGS": '["--threads", "1"]'}
    with ServerProcess(args, env=env) as server:
        body = {"alias": "agent", "checkpoint": "ckpt-door", "fraction": 0.5}
        set_canary = httpx.post(
            f"{server.base}/admin/canary", json=body, headers=admin_of(db), timeout=120
        )
        assert set_canary.status_code == 200, set_canary.text
        # The loop is off, so no verdict was recorded: the A/B page says so rather than
        # deciding on its own (it shows what the loop recorded, `ledger.recorded`).
        page = httpx.get(f"{server.base}/dashboard/ab", headers=admin_of(db), timeout=30)
        assert page.status_code == 200, page.text
        assert "No verdict yet" in page.text and "loop is off" in page.text


def test_the_dashboard_refuses_before_it_runs_a_query():
    """The pages' routes over no database at all: a page that ran a query before checking
    the key would fail (500) where a refusal is a 401."""
    settings = ServeSettings(proxy=ProxySettings(admin_key="adm-2f9e"))
    app = Litestar(
        route_handlers=pages.routes(settings, collector=None, router=None),
        exception_handlers=HANDLERS,
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for path in ("/dashboard?minutes=10080", "/dashboard/groups", "/dashboard/ab"):
            for refused in ({}, basic("wrong"), {"Authorization": "Bearer wrong"}):
                reply = client.get(path, headers=refused)
                assert reply.status_code == 401, (path, reply.text)
                assert reply.headers["WWW-Authenticate"].startswith("Basic")
        # The door opened, the page runs (and, with no database, fails): the refusal above
        # came before it.
        assert client.get("/dashboard", headers=basic("adm-2f9e")).status_code == 500


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("10.1.2.3", True),
        ("localhost", True),
        ("app.localhost:8000", True),
        ("onjob.internal:8000", True),  # configured
        ("evil.example:8000", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
    ],
)
def test_which_hosts_name_this_server(host, ok):
    doors = Doors(ProxySettings(allowed_hosts=["onjob.internal"]))
    try:
        doors.same_site({"host": host}, host=True)
    except Exception:
        assert not ok
    else:
        assert ok


def test_admin_bodies_are_checked_and_refused_changes_are_409(keyless):
    """Each admin body is decoded as its route's type before the handler runs (400 naming
    what is wrong, nothing changed), and a change the release code refuses is a 409 in
    OpenAI's shape, whichever route asked."""
    server, db = keyless
    mine = admin_of(db)
    bad = [
        ("/admin/canary", {"alias": "agent"}),  # no checkpoint
        ("/admin/canary", {"alias": "agent", "checkpoint": "c", "extra": 1}),  # unknown field
        ("/admin/promote", {"alias": 3}),  # a number where a name goes
        ("/admin/loop", {}),
        ("/admin/sql", {"limit": 3}),
        ("/admin/forget", {"trajectory": ["t"]}),
        ("/admin/export", {"table": None}),
    ]
    for path, body in bad:
        reply = httpx.post(f"{server.base}{path}", json=body, headers=mine)
        assert reply.status_code == 400, (path, body, reply.text)
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error", (path, error)
        assert error["message"].startswith("Invalid body"), (path, error)
    garbled = httpx.post(
        f"{server.base}/admin/canary",
        content=b'{"alias": "agent",',
        headers={**mine, "Content-Type": "application/json"},
    )
    assert garbled.status_code == 400, garbled.text
    refused = [
        ("/admin/canary", {"alias": "agent", "checkpoint": "ckpt-none", "fraction": 0.5}),
        ("/admin/promote", {"alias": "agent"}),  # no canary to promote
        ("/admin/rollback", {"alias": "nobody"}),
    ]
    for path, body in refused:
        reply = httpx.post(f"{server.base}{path}", json=body, headers=mine)
        assert reply.status_code == 409, (path, body, reply.text)
        assert reply.json()["error"]["code"] == 409, (path, reply.text)
    status = httpx.get(f"{server.base}/admin/status", headers=mine).json()
    assert status["aliases"]["agent"]["canary"] is None  # nothing changed


def test_a_loop_that_is_off_refuses_the_pause_button_and_the_admin_switch_alike():
    """One rule for both doors (`PeriodicLoop.switch`): with `loop.interval_s = 0` the
    dashboard's Pause and the admin API's loop switch are a 409 saying why, and nothing
    is paused."""
    from onjob.deploy import admin
    from onjob.deploy.loop import OFF, PeriodicLoop

    settings = ServeSettings(proxy=ProxySettings(admin_key="adm-2f9e"), loop={"interval_s": 0})
    loop = PeriodicLoop(collector=None, operator=None, settings=settings)
    app = Litestar(
        route_handlers=[
            *pages.routes(settings, collector=None, router=None, loop=loop),
            *admin.routes(settings, None, None, None, loop),
        ],
        exception_handlers=HANDLERS,
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        button = client.post("/dashboard/act", json={"action": "pause"}, headers=basic("adm-2f9e"))
        switch = client.post(
            "/admin/loop", json={"running": False}, headers={"Authorization": "Bearer adm-2f9e"}
        )
    for reply in (button, switch):
        assert reply.status_code == 409, reply.text
        assert reply.json()["error"]["message"] == OFF
    assert loop.state.paused is False
