"""Tenants kept apart, through a real `onjob serve` and the real openai client: neither a
trajectory nor a scenario ever spans two API keys, even when both name the same one.
(Feedback only on a key's own exchanges: `test_security.py`; the judge's groups and the
training snapshot: `test_tenant_judging.py`.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from pydantic import ValidationError

from onjob.cli.process import ServerProcess
from onjob.proxy import ProxySettings

from .conftest import rows

KEYS = {"alice": "sk-alice-31c9e07a", "bob": "sk-bob-5a7d2f18"}
SYSTEM = {"role": "system", "content": "You are a support agent."}
ASK = {"role": "user", "content": "My order has not arrived."}


ADMIN = "adm-70e3c95b1d"


def serve(tmp_path: Path, engine_url: str, **env: str) -> ServerProcess:
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__API_KEYS": json.dumps(KEYS),
        "ONJOB_PROXY__ADMIN_KEY": ADMIN,
        **env,
    }
    args = ["--engine-url", engine_url, "--db", str(tmp_path / "onjob.duckdb")]
    return ServerProcess(args, env=env, log=tmp_path / "server.log")


def converse(server: ServerProcess, secret: str, **extra) -> None:
    """The same two-turn conversation, word for word, whoever sends it."""
    client = OpenAI(base_url=server.url, api_key=secret, max_retries=0, timeout=30)
    messages = [SYSTEM, ASK]
    first = client.chat.completions.create(model="agent", messages=messages, **extra)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "It was due on Monday."},
    ]
    client.chat.completions.create(model="agent", messages=messages, **extra)


def by_key(db: Path) -> dict[str, list[dict]]:
    logged = rows(
        db,
        "SELECT api_key_id, trajectory_id, turn, scenario_id FROM exchanges "
        "ORDER BY api_key_id, turn",
    )
    return {k: [r for r in logged if r["api_key_id"] == k] for k in KEYS}


def test_two_keys_sending_the_same_conversation_make_two_trajectories(tmp_path, fake_engine_url):
    with serve(tmp_path, fake_engine_url) as server:
        for secret in KEYS.values():
            converse(server, secret)
        converse(server, KEYS["alice"], extra_headers={"X-Onjob-Trajectory": "ticket-1"})
        converse(server, KEYS["bob"], extra_headers={"X-Onjob-Trajectory": "ticket-1"})
        # A key's named conversation has a page of its own on the dashboard (once loaded).
        admin = {"Authorization": f"Bearer {ADMIN}"}
        count = {"query": "SELECT count(*) FROM exchanges WHERE trajectory_id = 'alice:ticket-1'"}

        def loaded() -> int:
            answer = httpx.post(f"{server.base}/admin/sql", json=count, headers=admin).json()
            return answer["rows"][0][0]

        deadline = time.monotonic() + 30
        while loaded() < 2:
            assert time.monotonic() < deadline, "never loaded"
            time.sleep(0.05)
        page = httpx.get(
            f"{server.base}/dashboard/trajectories/alice:ticket-1",
            headers=admin,
            timeout=30,
        )
        assert page.status_code == 200 and "It was due on Monday." in page.text
    db = tmp_path / "onjob.duckdb"
    logged = by_key(db)
    for key, mine in logged.items():
        derived = [r for r in mine if r["trajectory_id"].startswith("traj_")]
        named = [r for r in mine if not r["trajectory_id"].startswith("traj_")]
        # Each key's conversation is one trajectory of two turns, its own.
        assert [r["turn"] for r in derived] == [0, 1]
        assert len({r["trajectory_id"] for r in derived}) == 1
        # The name both sent is each key's own conversation.
        assert [(r["trajectory_id"], r["turn"]) for r in named] == [
            (f"{key}:ticket-1", 0),
            (f"{key}:ticket-1", 1),
        ]
    alice_ids = {r["trajectory_id"] for r in logged["alice"]}
    assert not alice_ids & {r["trajectory_id"] for r in logged["bob"]}
    spans = rows(
        db,
        "SELECT trajectory_id FROM exchanges GROUP BY trajectory_id "
        "HAVING count(DISTINCT api_key_id) > 1",
    )
    assert spans == []
    trajectories = rows(db, "SELECT n_turns FROM trajectories")
    assert [r["n_turns"] for r in trajectories] == [2, 2, 2, 2]
    # The same situation is each key's own scenario.
    derived = {
        k: {r["scenario_id"] for r in logged[k] if r["trajectory_id"][:5] == "traj_"} for k in KEYS
    }
    assert len(derived["alice"]) == len(derived["bob"]) == 1
    assert derived["alice"] != derived["bob"]


def test_two_keys_naming_the_same_scenario_make_two_scenarios(tmp_path, fake_engine_url):
    named = {"extra_headers": {"X-Onjob-Scenario": "refunds"}}
    with serve(tmp_path, fake_engine_url) as server:
        for secret in KEYS.values():
            converse(server, secret, **named)
        converse(server, KEYS["alice"], **named)  # alice again: her own scenario again
        # The body's metadata names it the same way as the header.
        client = OpenAI(base_url=server.url, api_key=KEYS["bob"], max_retries=0, timeout=30)
        client.chat.completions.create(
            model="agent",
            messages=[{"role": "user", "content": "Another question."}],
            metadata={"scenario": "refunds"},
        )
    db = tmp_path / "onjob.duckdb"
    logged = by_key(db)
    scenario = {k: {r["scenario_id"] for r in mine} for k, mine in logged.items()}
    assert len(scenario["alice"]) == len(scenario["bob"]) == 1
    assert scenario["alice"] != scenario["bob"]
    counted = rows(db, "SELECT id, key, keyed, count FROM scenarios")
    by_id = {r["id"]: r for r in counted}
    assert set(by_id) == scenario["alice"] | scenario["bob"]
    # Both keep the name they gave (rubrics are chosen by it); each counts its own.
    assert {r["key"] for r in counted} == {"refunds"} and {r["keyed"] for r in counted} == {
        "explicit"
    }
    assert by_id[next(iter(scenario["alice"]))]["count"] == 2
    assert by_id[next(iter(scenario["bob"]))]["count"] == 2


def test_api_key_ids_cannot_hold_the_separator_of_named_conversations():
    # "a" naming "b:c" and "a:b" naming "c" would both be "a:b:c".
    with pytest.raises(ValidationError, match="holds ':'"):
        ProxySettings(api_keys={"a": "sk-1", "a:b": "sk-2"})
