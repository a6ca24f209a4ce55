"""Canary arms in the proxy (in process, the engine scripted at the HTTP boundary): the
fraction holds over many conversations, a conversation keeps its arm, `X-Onjob-Arm`
pins, and a failing canary is answered by live and counted against the canary."""

from __future__ import annotations

import json

import httpx
from litestar.testing import TestClient

from onjob.collector import Collector, CollectorSettings
from onjob.proxy import ProxySettings, create_app

from .conftest import rows
from .fake_engine import completion, scripted

CANARY = {"agent": {"checkpoint": "ckpt-b", "fraction": 0.3}}


def echo_engine(broken: set[str] = frozenset(), wrong: set[str] = frozenset()):
    """Answers with the model it was asked for; 404 for adapters in `broken`; as another
    model for those in `wrong`."""

    def chat(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        if model in broken:
            error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError"}
            return httpx.Response(404, json={"error": {**error, "param": None, "code": 404}})
        answered_as = "stale-adapter" if model in wrong else model
        return httpx.Response(200, json=completion(model, model=answered_as))

    return scripted(chat)


def app_for(tmp_path, upstream, **proxy):
    collector = Collector(CollectorSettings(db=tmp_path / "onjob.duckdb"))
    settings = ProxySettings(aliases={"agent": "ckpt-a"}, canaries=CANARY, **proxy)
    return create_app(settings, upstream=upstream, collector=collector)


def ask(client, content: str, headers=None, history=()):
    messages = [*history, {"role": "user", "content": content}]
    resp = client.post(
        "/v1/chat/completions", json={"model": "agent", "messages": messages}, headers=headers
    )
    assert resp.status_code == 200, resp.text
    return resp


def test_canary_fraction_holds_and_conversations_keep_their_arm(tmp_path):
    n = 600
    with TestClient(app_for(tmp_path, echo_engine())) as client:
        first = {}
        for i in range(n):
            r = ask(client, f"question {i}")
            first[i] = (r.headers["x-onjob-arm"], r.json()["choices"][0]["message"]["content"])
        share = sum(arm == "canary" for arm, _ in first.values()) / n
        # Binomial(600, 0.3): the standard deviation is 0.019; four of them is the tolerance.
        assert abs(share - 0.3) < 0.075, share
        assert all((arm == "canary") == (model == "ckpt-b") for arm, model in first.values())
        assert all((arm == "live") == (model == "ckpt-a") for arm, model in first.values())
        # Second turns continue their conversations, on the same arm.
        for i in range(0, n, 10):
            history = [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": first[i][1]},
            ]
            assert ask(client, "and then?", history=history).headers["x-onjob-arm"] == first[i][0]
    logged = rows(tmp_path / "onjob.duckdb", "SELECT arm, checkpoint, turn FROM exchanges")
    assert {(r["arm"], r["checkpoint"]) for r in logged} == {
        ("live", "ckpt-a"),
        ("canary", "ckpt-b"),
    }
    assert sum(r["turn"] == 1 for r in logged) == n // 10


def test_the_arm_header_pins_live_canary_or_a_named_checkpoint(tmp_path):
    operator = {"Authorization": "Bearer adm-key"}
    with TestClient(app_for(tmp_path, echo_engine(), admin_key="adm-key")) as client:
        for pin, model, arm, headers in [
            ("canary", "ckpt-b", "canary", {}),
            ("live", "ckpt-a", "live", {}),
            ("ckpt-b", "ckpt-b", "pinned", {}),  # what the alias serves, by its name
            ("ckpt-old", "ckpt-old", "pinned", operator),  # any checkpoint: the admin key
        ]:
            for i in range(5):
                r = ask(client, f"pinned {pin} {i}", headers={"X-Onjob-Arm": pin, **headers})
                assert r.json()["choices"][0]["message"]["content"] == model
                assert r.headers["x-onjob-arm"] == arm
        # A checkpoint no alias serves (a candidate, a rolled-back one) is not any caller's.
        for headers in ({}, {"Authorization": "Bearer adm-wrong"}):
            refused = client.post(
                "/v1/chat/completions",
                json={"model": "agent", "messages": [{"role": "user", "content": "hi"}]},
                headers={"X-Onjob-Arm": "ckpt-old", **headers},
            )
            assert refused.status_code == 403, refused.text
            assert "needs the admin key" in refused.json()["error"]["message"]
    logged = rows(tmp_path / "onjob.duckdb", "SELECT checkpoint FROM exchanges")
    assert sum(r["checkpoint"] == "ckpt-old" for r in logged) == 5  # the refused never ran


def test_a_failing_canary_is_answered_by_live_and_counted_against_the_canary(tmp_path):
    with TestClient(app_for(tmp_path, echo_engine(broken={"ckpt-b"}))) as client:
        answers = [ask(client, f"question {i}") for i in range(60)]
    assert all(r.json()["choices"][0]["message"]["content"] == "ckpt-a" for r in answers)
    assert all(r.headers["x-onjob-arm"] == "live" for r in answers)
    logged = rows(
        tmp_path / "onjob.duckdb",
        "SELECT id, arm, status, error, trajectory_id, turn FROM exchanges ORDER BY ts",
    )
    failed = [r for r in logged if r["arm"] == "canary"]
    # The engine's 404 for an adapter the router sends to: the adapter is missing (503),
    # not a model the client named wrongly.
    assert failed and all(r["status"] == 503 and "does not exist" in r["error"] for r in failed)
    # Each failed canary attempt has its live answer, in the same conversation and turn.
    answered = {(r["trajectory_id"], r["turn"]) for r in logged if r["arm"] == "live"}
    assert all((r["trajectory_id"], r["turn"]) in answered for r in failed)
    assert {r.headers["x-onjob-exchange-id"] for r in answers} == {
        r["id"] for r in logged if r["arm"] == "live"
    }


def test_an_answer_from_another_model_than_asked_is_refused_not_logged_as_that_checkpoint(
    tmp_path,
):
    with TestClient(app_for(tmp_path, echo_engine(wrong={"ckpt-a"}))) as client:
        resp = client.post(
            "/v1/chat/completions",
            json={"model": "agent", "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Onjob-Arm": "live"},
        )
    assert resp.status_code == 502
    assert "answered as `stale-adapter`, not `ckpt-a`" in resp.json()["error"]["message"]
    [logged] = rows(
        tmp_path / "onjob.duckdb", "SELECT checkpoint, served_model, status, error FROM exchanges"
    )
    assert logged["status"] == 502 and "stale-adapter" in logged["error"]
    assert (logged["checkpoint"], logged["served_model"]) == ("ckpt-a", "stale-adapter")
