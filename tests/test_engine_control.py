"""The local engine's adapter routes answer loopback peers only and, with an adapter token,
only requests that carry it (issue 34 item 7); onjob's own control client carries it. A
real engine process, real HTTP."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from onjob.cli.process import EngineProcess
from onjob.cli.settings import ServeSettings
from onjob.deploy.act import adapters
from onjob.deploy.act.engine import engine_client

TOKEN = "engine-secret-for-tests"


@pytest.fixture(scope="module")
def guarded_engine(tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--threads", "1"]
    with EngineProcess(args, env={"ONJOB_ENGINE_ADAPTER_TOKEN": TOKEN}) as proc:
        yield proc


def served(engine) -> set[str]:
    models = httpx.get(f"{engine.url}/models", timeout=10).json()["data"]
    return {m["id"] for m in models if m.get("parent")}


def test_adapter_routes_need_the_token(guarded_engine, tiny_adapter_dir):
    url = guarded_engine.url
    load = {"lora_name": "a1", "lora_path": str(tiny_adapter_dir)}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        resp = httpx.post(f"{url}/load_lora_adapter", json=load, headers=headers, timeout=60)
        assert resp.status_code == 401, resp.text
        error = resp.json()["error"]
        assert error["type"] == "authentication_error" and "adapter token" in error["message"]
        unload = httpx.post(
            f"{url}/unload_lora_adapter", json={"lora_name": "a1"}, headers=headers, timeout=60
        )
        assert unload.status_code == 401
    assert served(guarded_engine) == set()  # nothing was loaded by the refused calls

    good = {"Authorization": f"Bearer {TOKEN}"}
    resp = httpx.post(f"{url}/load_lora_adapter", json=load, headers=good, timeout=60)
    assert resp.status_code == 200, resp.text
    assert served(guarded_engine) == {"a1"}
    resp = httpx.post(
        f"{url}/unload_lora_adapter", json={"lora_name": "a1"}, headers=good, timeout=60
    )
    assert resp.status_code == 200 and served(guarded_engine) == set()
    # The OpenAI routes need no token.
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{url}/chat/completions", json=chat, timeout=60).status_code == 200


def test_a_peer_beyond_loopback_is_refused_even_with_the_token(guarded_engine, tiny_adapter_dir):
    # uvicorn takes the peer from X-Forwarded-For when the connection comes from 127.0.0.1
    # (a reverse proxy on the host): the engine then sees the remote client, and refuses it.
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": "192.0.2.7"}
    load = {"lora_name": "a2", "lora_path": str(tiny_adapter_dir)}
    resp = httpx.post(
        f"{guarded_engine.url}/load_lora_adapter", json=load, headers=headers, timeout=60
    )
    assert resp.status_code == 403, resp.text
    assert "192.0.2.7" in resp.json()["error"]["message"]
    assert served(guarded_engine) == set()


def test_onjobs_control_client_sends_the_token(guarded_engine, tiny_adapter_dir):
    async def go(token: str | None) -> None:
        settings = ServeSettings(proxy={"engine_url": guarded_engine.url, "engine_token": token})
        async with engine_client(settings) as engine:
            if token is None:
                with pytest.raises(adapters.EngineControlError, match="401"):
                    await adapters.ensure_loaded(engine, "a3", str(tiny_adapter_dir))
                return
            assert await adapters.ensure_loaded(engine, "a3", str(tiny_adapter_dir))
            assert served(guarded_engine) == {"a3"}
            await adapters.unload(engine, "a3")

    asyncio.run(go(None))
    asyncio.run(go(TOKEN))
    assert served(guarded_engine) == set()
