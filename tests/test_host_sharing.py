"""Serving and training share a host without pausing traffic (issue 45 item 1): while a
training run takes its cores, a local engine on the host serves on the others, and gets
them back when the run ends or when the loop starts after a run died with its server.
A real engine process, real HTTP; an engine without the route (vLLM) scripted at the
HTTP boundary."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest

from onjob.cli.process import EngineProcess
from onjob.deploy.act import host
from onjob.trainer import TrainSettings

TOKEN = "engine-secret-for-host-tests"


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--threads", "3"]
    with EngineProcess(args, env={"ONJOB_ENGINE_ADAPTER_TOKEN": TOKEN}) as proc:
        yield proc


def threads(engine) -> int:
    (card,) = [m for m in httpx.get(f"{engine.url}/models", timeout=10).json()["data"]]
    return card["threads"]


def chat(engine) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(f"{engine.url}/chat/completions", json=body, timeout=60)


def client(engine) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=engine.url, headers={"Authorization": f"Bearer {TOKEN}"})


def test_the_engine_serves_on_the_cores_a_run_leaves_and_gets_them_back(engine):
    assert threads(engine) == 3
    said: list[str] = []
    during: list[int] = []

    async def go():
        async with client(engine) as c, host.beside(c, 1, said.append) as idle:
            during.append(threads(engine))
            assert chat(engine).status_code == 200  # traffic goes on while the run trains
            assert idle is False  # a core of its own: the run trains at its own priority

    asyncio.run(go())
    assert during == [max(1, host.cores() - 1)]
    assert threads(engine) == 3  # its own count again
    assert "the engine serves on" in said[0]


def test_the_engine_gets_its_cores_back_when_the_block_fails(engine):
    async def go():
        async with client(engine) as c, host.beside(c, 1, print):
            raise RuntimeError("the training run failed")

    with pytest.raises(RuntimeError):
        asyncio.run(go())
    assert threads(engine) == 3


def test_an_engine_a_killed_run_left_shrunken_gets_its_own_count_after_the_next_run(engine):
    resp = httpx.post(
        f"{engine.base}/onjob/threads",
        json={"threads": 1},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert resp.json() == {"threads": 1, "was": 3, "started_with": 3}
    assert threads(engine) == 1

    async def go():
        async with client(engine) as c, host.beside(c, 1, print):
            pass

    asyncio.run(go())
    assert threads(engine) == 3  # the count it started with, not the 1 it was left at


def test_the_thread_route_is_guarded_and_checks_its_body(engine):
    url = f"{engine.base}/onjob/threads"
    assert httpx.post(url, json={"threads": 1}, timeout=30).status_code == 401
    good = {"Authorization": f"Bearer {TOKEN}"}
    for body in ({"threads": 0}, {"threads": "2"}, {"threads": 10**6}):
        resp = httpx.post(url, json=body, headers=good, timeout=30)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["type"] == "invalid_request_error"
    assert threads(engine) == 3


def test_an_engine_without_the_route_keeps_its_threads_and_the_run_trains_at_idle_priority():
    # vLLM has no /onjob/threads: its 404 leaves it as it is, and the run trains beside it
    # at idle priority (its threads would wait for the core the run holds).
    seen: list[str] = []
    idle: list[bool] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(404, json={"detail": "Not Found"})

    said: list[str] = []

    async def go(url: str):
        transport = httpx.MockTransport(vllm)
        async with (
            httpx.AsyncClient(base_url=url, transport=transport) as c,
            host.beside(c, 1, said.append) as low,
        ):
            idle.append(low)

    asyncio.run(go("http://127.0.0.1:8001/v1"))
    assert seen == ["/onjob/threads"]
    assert "at idle priority" in said[0] and "keeps its own" in said[0]
    # An engine on another host is not asked at all: its cores are not the run's.
    seen.clear()
    asyncio.run(go("http://10.0.0.7:8001/v1"))
    assert seen == []
    assert idle == [True, False] and "on another host" in said[1]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_run_told_to_be_idle_runs_at_the_cpus_idle_priority_threads_included():
    """The trainer's own set-up, in a process of its own (a policy cannot be raised back
    without privileges): the process and a thread it starts after are SCHED_IDLE."""
    code = (
        "import os, threading\n"
        "from onjob.trainer import TrainSettings\n"
        "from onjob.trainer.setup import machine\n"
        "machine(TrainSettings(idle=True, threads=1))\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))\n"
        "t.start(); t.join()\n"
        "print(os.sched_getscheduler(0) == os.SCHED_IDLE, seen[0] == os.SCHED_IDLE)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_a_run_takes_half_the_cores_unless_told():
    assert host.trainer_threads(TrainSettings()) == max(1, host.cores() // 2)
    assert host.trainer_threads(TrainSettings(threads=3)) == 3
