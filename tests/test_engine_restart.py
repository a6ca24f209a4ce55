"""A restarted engine has forgotten every runtime-loaded adapter: through a real `onjob
serve` and a real engine killed and started again on the same port, the live checkpoint
is loaded again, the requests in between are answered 503 (never by the base model under
the checkpoint's name), and each exchange records the model that really answered."""

from __future__ import annotations

import time

import httpx
from openai import APIStatusError, OpenAI

from onjob.cli.process import EngineProcess, ServerProcess
from onjob.collector import Store
from onjob.deploy.act import registry

from .conftest import admin_of, rows

CHECKPOINT = "ckpt-live"


def engine_args(model_dir) -> list[str]:
    return ["--model", str(model_dir), "--served-model-name", "tiny", "--threads", "1"]


def make_live(server: ServerProcess, checkpoint: str) -> None:
    for path, body in [
        ("canary", {"alias": "agent", "checkpoint": checkpoint, "fraction": 1.0}),
        ("promote", {"alias": "agent"}),
    ]:
        admin = admin_of(server)
        resp = httpx.post(f"{server.base}/admin/{path}", json=body, headers=admin, timeout=60)
        assert resp.status_code == 200, resp.text


def adapters_in(engine: EngineProcess) -> set[str]:
    models = httpx.get(f"{engine.url}/models", timeout=10).json()["data"]
    return {m["id"] for m in models if m.get("parent")}


def ask(client: OpenAI, i: int):
    return client.chat.completions.with_raw_response.create(
        model="agent", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2
    )


def test_after_an_engine_restart_the_live_checkpoint_is_reloaded_and_never_faked(
    tmp_path, tiny_model_dir, tiny_adapter_dir
):
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, tiny_adapter_dir, CHECKPOINT, tiny_model_dir)
    store.close()
    engine = EngineProcess(engine_args(tiny_model_dir)).start()
    # A long health interval: the restart is noticed by the engine's 404, not by a check.
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__HEALTH_INTERVAL_S": "60"}
    try:
        with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
            make_live(server, CHECKPOINT)
            client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
            for i in range(3):
                assert ask(client, i).http_response.status_code == 200

            engine.kill()
            engine = EngineProcess(engine_args(tiny_model_dir), port=engine.port).start()
            assert CHECKPOINT not in adapters_in(engine)  # the restart forgot it

            try:
                ask(client, 100)
                raise AssertionError("answered before the checkpoint was reloaded")
            except APIStatusError as exc:
                assert exc.status_code == 503
                assert exc.response.headers["retry-after"] == "1"
                error = exc.response.json()["error"]
                assert error["type"] == "service_unavailable"
                assert f"`{CHECKPOINT}` is not loaded" in error["message"]

            deadline = time.monotonic() + 20
            answered = 0
            while answered < 5 and time.monotonic() < deadline:
                try:
                    ask(client, 200 + answered)
                    answered += 1
                except APIStatusError as exc:
                    assert exc.status_code == 503, exc.response.text
                    time.sleep(0.1)
            assert answered == 5, "the checkpoint was not reloaded within 20 s"
            assert CHECKPOINT in adapters_in(engine)
    finally:
        engine.stop()

    logged = rows(db, "SELECT status, checkpoint, served_model FROM exchanges ORDER BY ts")
    assert {r["checkpoint"] for r in logged} == {CHECKPOINT}
    assert all(r["served_model"] == CHECKPOINT for r in logged if r["status"] == 200)
    assert sum(r["status"] == 200 for r in logged) == 8
    assert not any(r["served_model"] == "tiny" for r in logged)  # never the base model
    assert {r["status"] for r in logged} == {200, 503}
