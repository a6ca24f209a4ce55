"""Several engines behind one `onjob serve` (`proxy.engine_urls`): a request goes to the
healthy engine with the fewest outstanding; one that dies is failed over without a client
noticing; it is put back only once its adapters are loaded again."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from openai import OpenAI

from onjob.cli.process import EngineProcess, ServerProcess
from onjob.collector import Store
from onjob.deploy.act import registry
from onjob.proxy.errors import AdapterUnavailable
from onjob.proxy.pool import Pool, Replica

from .conftest import admin_of, rows
from .fake_engine import HttpxUpstream, completion
from .test_engine_restart import adapters_in, engine_args

LIVE, CANARY = "ckpt-live", "ckpt-canary"


def test_a_request_goes_to_the_engine_with_the_fewest_outstanding():
    """One engine is stuck on its first request, the other answers at once: after the
    first, every request goes to the free one (round robin would send it half)."""
    release = asyncio.Event()
    answered = {"stuck": 0, "free": 0}

    def engine(name: str) -> HttpxUpstream:
        async def chat(request: httpx.Request) -> httpx.Response:
            answered[name] += 1
            if name == "stuck":
                await release.wait()
            return httpx.Response(200, json=completion())

        client = httpx.AsyncClient(
            transport=httpx.MockTransport(chat), base_url=f"http://{name}/v1"
        )
        return HttpxUpstream(client)

    async def run():
        pool = Pool([Replica(f"http://{n}/v1", engine(n)) for n in ("stuck", "free")])
        tasks = []
        for _ in range(20):
            sent = pool.send("/chat/completions", b"{}", "m", whole=True)
            tasks.append(asyncio.create_task(sent))
            await asyncio.sleep(0.01)
        outstanding = [r.outstanding for r in pool.replicas]
        release.set()
        await asyncio.gather(*tasks)
        await pool.aclose()
        return outstanding

    outstanding = asyncio.run(run())
    assert answered == {"stuck": 1, "free": 19}
    assert outstanding == [1, 0]


def test_with_one_engine_down_and_the_other_reloading_the_adapter_the_answer_is_503():
    """Not the dead engine's 502: the adapter is on its way back."""

    def lost(request: httpx.Request) -> httpx.Response:
        error = {"message": "The model `ckpt` does not exist.", "type": "NotFoundError"}
        return httpx.Response(404, json={"error": {**error, "param": None, "code": 404}})

    def dead(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def replica(name: str, handler) -> Replica:
        client = httpx.AsyncClient(
            transport=httpx.MockTransport(handler), base_url=f"http://{name}/v1"
        )
        return Replica(f"http://{name}/v1", HttpxUpstream(client), control=client)

    async def run():
        pool = Pool([replica("lost", lost), replica("dead", dead)], wanted=lambda: {"ckpt"})
        try:
            await pool.send("/chat/completions", b"{}", "ckpt", whole=True)
        except AdapterUnavailable as exc:
            states = [(str(r.state), r.missing) for r in pool.replicas]
            return exc, states
        finally:
            await pool.aclose()
        raise AssertionError("answered")

    exc, states = asyncio.run(run())
    assert exc.status == 503 and "`ckpt` is not loaded" in exc.message
    assert states == [("up", {"ckpt"}), ("down", set())]


def status(server: ServerProcess) -> dict:
    admin = admin_of(server)
    return httpx.get(f"{server.base}/admin/status", headers=admin, timeout=10).json()


def wait_all_up(server: ServerProcess, engines: list[EngineProcess], timeout: float = 30):
    """Until the server has every engine up; each time it says so, the engine must already
    serve every routed adapter (it is never put back without them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = status(server)["engines"]
        for state, engine in zip(states, engines, strict=True):
            if state["state"] == "up":
                assert {LIVE, CANARY} <= adapters_in(engine), (state, adapters_in(engine))
        if all(s["state"] == "up" for s in states):
            return
        time.sleep(0.1)
    raise AssertionError(f"not every engine is up after {timeout} s: {status(server)['engines']}")


def test_a_dead_engine_is_failed_over_and_back_only_with_its_adapters(
    tmp_path, tiny_model_dir, tiny_adapter_dir
):
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    for name in (LIVE, CANARY):
        registry.add(store, tiny_adapter_dir, name, tiny_model_dir)
    store.close()
    engines = [EngineProcess(engine_args(tiny_model_dir)).start() for _ in range(2)]
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__HEALTH_INTERVAL_S": "0.2",
        "ONJOB_PROXY__ENGINE_URLS": json.dumps([e.url for e in engines]),
    }
    stop = threading.Event()
    failures: list[str] = []
    answered: list[int] = []  # appends are atomic across the client threads

    def client_loop(k: int) -> None:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        i = 0
        while not stop.is_set():
            i += 1
            try:
                client.chat.completions.create(
                    model="agent",
                    messages=[{"role": "user", "content": f"client {k} question {i}"}],
                    max_tokens=2,
                )
                answered.append(k)
            except Exception as exc:  # every failure is the test's failure
                failures.append(repr(exc))

    try:
        with ServerProcess(["--db", str(db)], env=env) as server:
            for path, body in [
                ("canary", {"alias": "agent", "checkpoint": LIVE, "fraction": 1.0}),
                ("promote", {"alias": "agent"}),
                ("canary", {"alias": "agent", "checkpoint": CANARY, "fraction": 0.5}),
            ]:
                resp = httpx.post(
                    f"{server.base}/admin/{path}", json=body, headers=admin_of(db), timeout=60
                )
                assert resp.status_code == 200, resp.text
            assert all({LIVE, CANARY} <= adapters_in(e) for e in engines)  # loaded in each

            with ThreadPoolExecutor(3) as clients:
                running = [clients.submit(client_loop, k) for k in range(3)]
                try:  # a failed assertion must stop the clients, or the pool waits on them
                    time.sleep(1)
                    for down in (1, 0):  # each engine in turn: the other answers alone
                        engines[down].kill()
                        before = len(answered)
                        time.sleep(2)  # answered by the other alone
                        assert len(answered) > before
                        assert status(server)["engines"][down]["state"] == "down"
                        engines[down] = EngineProcess(
                            engine_args(tiny_model_dir), port=engines[down].port
                        ).start()
                        wait_all_up(server, engines)
                finally:
                    stop.set()
                for r in running:
                    r.result()
    finally:
        stop.set()
        for e in engines:
            e.stop()

    assert failures == []
    logged = rows(db, "SELECT status, arm, checkpoint, served_model FROM exchanges")
    assert len(logged) == len(answered) > 20
    assert {r["status"] for r in logged} == {200}
    # Every answer came from the adapter its arm names, on either engine, before and after
    # each restart: engine 1 answered alone (after its restart) while engine 0 was down.
    assert all(r["served_model"] == r["checkpoint"] for r in logged)
    assert {r["checkpoint"] for r in logged} == {LIVE, CANARY}


def test_the_judge_uses_one_of_the_engines_adapters_are_loaded_into():
    from pydantic import ValidationError

    from onjob.proxy import ProxySettings

    urls = ["http://a:8001/v1", "http://b:8001/v1"]
    assert ProxySettings(engine_urls=urls).engine_url == urls[0]
    assert ProxySettings(engine_urls=urls, engine_url=urls[1]).engine_url == urls[1]
    try:
        ProxySettings(engine_urls=urls, engine_url="http://c:8001/v1")
        raise AssertionError("an engine_url outside engine_urls was accepted")
    except ValidationError as exc:
        assert "no adapter is loaded into" in str(exc)
