"""The dashboard's pages in process (Litestar's test client) over the real DuckDB file the
proxy logged into, the engine scripted at the HTTP boundary: what a page shows of rows
the browser test (`test_dashboard.py`) never makes, such as failed requests."""

from __future__ import annotations

import html
import json
import re

import httpx
from litestar.testing import TestClient

from onjob import dashboard
from onjob.cli.settings import ServeSettings
from onjob.collector import Collector, CollectorSettings, Store
from onjob.deploy.act import deployments
from onjob.deploy.decide import ledger, verdict
from onjob.proxy import ProxySettings, create_app
from onjob.proxy.routing import Router

from .fake_engine import completion, scripted

ADMIN = "adm-5c1e0b7d"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
TOO_LONG = "This model's maximum context length is 2048 tokens"


def _engine():
    """Answers, but refuses a request asking "too long?" (400, as vLLM refuses one) and is
    unreachable for one asking "down?"."""

    def chat(request: httpx.Request) -> httpx.Response:
        last = json.loads(request.content)["messages"][-1]["content"]
        if last == "too long?":
            error = {"message": TOO_LONG, "type": "BadRequestError", "param": None, "code": 400}
            return httpx.Response(400, json={"error": error, "object": "error"})
        if last == "down?":
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json=completion("an answer"))

    return scripted(chat)


def settings_in(tmp_path) -> ServeSettings:
    return ServeSettings(
        proxy=ProxySettings(admin_key=ADMIN), collector=CollectorSettings(db=tmp_path / "o.duckdb")
    )


def site(tmp_path):
    """The proxy with the dashboard's pages, as `onjob serve` composes them, and its
    collector."""
    settings = settings_in(tmp_path)
    upstream = _engine()
    collector = Collector(settings.collector)
    router = Router.from_settings(settings.proxy, upstream)
    app = create_app(
        settings.proxy,
        upstream=upstream,
        collector=collector,
        router=router,
        routes=dashboard.routes(settings, collector, router),
    )
    return app, collector


def explorer_rows(page: str) -> dict[str, str]:
    """The request explorer's rows by status: each row's HTML."""
    row = r'<tr data-id="[^"]*" data-arm="[^"]*" data-status="(\d+)">(.*?)</tr>'
    return {status: html.unescape(cells) for status, cells in re.findall(row, page, re.S)}


def test_a_failed_request_shows_its_error_and_its_conversation_opens(tmp_path):
    """Was the status alone, and a refused first request's conversation link a 404: a
    failed exchange is no turn, so its conversation had no `trajectories` row (and a
    conversation the client named with a `#` in it was linked unquoted)."""
    app, collector = site(tmp_path)
    chat = {"model": "agent", "max_tokens": 4}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        named = {"metadata": {"trajectory_id": "ticket #7"}}
        refused = client.post("/v1/chat/completions", json={**chat, **named, "messages": [
            {"role": "user", "content": "too long?"}]})  # fmt: skip
        assert refused.status_code == 400
        asked = [{"role": "user", "content": "hello?"}]
        answered = client.post("/v1/chat/completions", json={**chat, "messages": asked})
        assert answered.status_code == 200
        # The conversation's second turn, while the engine is down: 502, and no turn.
        asked += [answered.json()["choices"][0]["message"], {"role": "user", "content": "down?"}]
        down = client.post("/v1/chat/completions", json={**chat, "messages": asked})
        assert down.status_code == 502
        client.blocking_portal.call(collector.flush)

        page = client.get("/dashboard/requests", headers=AS_ADMIN)
        assert page.status_code == 200, page.text
        rows = explorer_rows(page.text)
        assert set(rows) == {"400", "200", "502"}
        assert TOO_LONG in rows["400"]
        assert "cannot reach the engine" in rows["502"]
        assert 'class="error"' not in rows["200"]
        failed = client.get("/dashboard/requests?status=error", headers=AS_ADMIN).text
        assert set(explorer_rows(failed)) == {"400", "502"}

        def conversation(row: str) -> str:
            link = re.search(r'<a class="conversation" href="([^"]+)"', row)
            assert link, row
            shown = client.get(link.group(1), headers=AS_ADMIN)
            assert shown.status_code == 200, shown.text
            return html.unescape(shown.text)

        # A conversation whose one request was refused: its request and its error.
        alone = conversation(rows["400"])
        assert "Conversation <code>ticket #7</code>" in alone and "No answered turn" in alone
        assert TOO_LONG in alone and "too long?" in alone
        # A conversation with an answered turn and a failed one: both turns, the error.
        both = conversation(rows["502"])
        assert "1 turns" in both and "cannot reach the engine" in both
        assert conversation(rows["200"]) == both
        assert client.get("/dashboard/trajectories/none", headers=AS_ADMIN).status_code == 404


def test_the_ab_page_states_each_source_of_answers_shape_once(tmp_path):
    """Was a garbled line in docs/images/dashboard/ab.png ("paired samples: ... empty /,
    cut /, malformed /" twice more): the page read every guard of the verdict's `shape`
    evidence, the KL and judge guards included, as an answers' shape."""
    settings = settings_in(tmp_path)
    store = Store(settings.collector.db)
    store.dicts("INSERT INTO checkpoints (name, status) VALUES ('mild', 'candidate')")
    deployments.set_canary(
        store, "agent", "mild", 0.5, default_live=None, reason="by hand", actor="test"
    )
    routing = deployments.current(store)["agent"]
    seen = verdict.decide(store, settings, "mild", None, routing, rounds=1)
    ledger.record(store, "agent", "mild", "canary", seen)  # as the loop records its look
    store.close()
    app, _ = site(tmp_path)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        page = client.get("/dashboard/ab", headers=AS_ADMIN)
    assert page.status_code == 200, page.text
    assert '<strong class="decision">wait</strong>' in page.text
    shape = re.search(r'<p class="shape">(.*?)</p>', page.text, re.S)
    assert shape, page.text
    said = " ".join(html.unescape(re.sub(r"<[^>]+>", "", shape.group(1))).split())
    assert said.count("paired samples:") == 1 and said.count("real traffic:") == 1, said
    assert said.count("median length") == 2, said  # the two sources, nothing else
    assert not re.search(r"(empty|cut|malformed) /", said), said  # a figure on each side
