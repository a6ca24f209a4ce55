"""Canary arms through a real `onjob serve` and a real engine with a real adapter loaded,
driven by the `openai` client."""

from __future__ import annotations

import json

from openai import OpenAI

from onjob.cli.process import ServerProcess

from .conftest import rows


def serve(tmp_path, engine, canary: str, fraction: float) -> ServerProcess:
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__CANARIES": json.dumps(
            {"agent": {"checkpoint": canary, "fraction": fraction}}
        ),
    }
    return ServerProcess(["--engine-url", engine.url, "--db", str(tmp_path / "db")], env=env)


def test_real_traffic_splits_by_conversation_and_each_keeps_its_arm(
    tmp_path, engine, adapter_loaded
):
    n = 200
    with serve(tmp_path, engine, adapter_loaded, 0.5) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        arms = {}
        for i in range(n):
            messages = [{"role": "user", "content": f"conversation {i}"}]
            raw = client.chat.completions.with_raw_response.create(
                model="agent", messages=messages, max_tokens=2
            )
            reply = raw.parse().choices[0].message
            arms[i] = raw.headers["x-onjob-arm"]
            if i % 20 == 0:  # a second turn stays on the conversation's arm
                messages += [{"role": "assistant", "content": reply.content}]
                messages += [{"role": "user", "content": "more"}]
                again = client.chat.completions.with_raw_response.create(
                    model="agent", messages=messages, max_tokens=2
                )
                assert again.headers["x-onjob-arm"] == arms[i]
        pinned = client.chat.completions.with_raw_response.create(
            model="agent",
            messages=[{"role": "user", "content": "pinned"}],
            max_tokens=2,
            extra_headers={"X-Onjob-Arm": "canary"},
        )
        assert pinned.headers["x-onjob-arm"] == "canary"
    share = sum(a == "canary" for a in arms.values()) / n
    assert abs(share - 0.5) < 0.15, share  # Binomial(200, 0.5): 4 standard deviations
    logged = rows(tmp_path / "db", "SELECT arm, checkpoint, status FROM exchanges")
    assert {(r["arm"], r["checkpoint"]) for r in logged} == {("live", None), ("canary", "canary-a")}
    assert all(r["status"] == 200 for r in logged)


def test_a_canary_whose_adapter_is_missing_is_answered_by_live(tmp_path, engine):
    with serve(tmp_path, engine, "not-loaded", 1.0) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        for i in range(5):
            raw = client.chat.completions.with_raw_response.create(
                model="agent", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2
            )
            assert raw.headers["x-onjob-arm"] == "live" and raw.parse().choices[0].message
    logged = rows(tmp_path / "db", "SELECT arm, status, error FROM exchanges")
    failed = [r for r in logged if r["arm"] == "canary"]
    assert len(failed) == 5 and all(r["status"] == 503 for r in failed)
    assert sum(r["arm"] == "live" and r["status"] == 200 for r in logged) == 5
