"""onjob's own work gives way to users: a judge pass with no scorer re-samples nothing,
every re-sample is marked background (vLLM's `priority`) and asked again without it of an
engine that refuses priorities, background requests wait while others queue in the
engine (its `/metrics`), and a client's own `priority` never reaches the engine. Real
DuckDB files and the real judge pass; the engine scripted at its HTTP boundary."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time

import httpx
from litestar.testing import TestClient

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings
from onjob.judge import NO_SCORER, JudgeSettings, run_pass
from onjob.judge.admission import Admission
from onjob.judge.sampling import BACKGROUND

from .test_proxy_fields import CHAT, recording_app
from .test_release_path import fn, logged
from .test_reward_hacking import HEDGING, engine

REFUSAL = {
    "object": "error",
    "message": "Got priority 10 but Priority scheduling is not enabled.",
    "type": "BadRequestError",
    "code": 400,
}


def judged(db, judge: JudgeSettings, *, priorities: bool = True, waiting=()):
    """One judge pass over `db` against the scripted engine; the chat bodies it was sent,
    the pass's report and what it said. `waiting`: the engine's queue at each read of
    its `/metrics` (none left: nothing waits)."""
    seen: list[dict] = []
    said: list[str] = []
    handle, queue = engine(HEDGING), list(waiting)

    def recording(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            n = queue.pop(0) if queue else 0
            return httpx.Response(200, text=f'vllm:num_requests_waiting{{model_name="base"}} {n}\n')
        if request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            seen.append(body)
            if "priority" in body and not priorities:
                return httpx.Response(400, json=REFUSAL)
        return handle(request)

    async def run():
        collector = Collector(CollectorSettings(db=db))
        await collector.start()
        transport = httpx.MockTransport(recording)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://e/v1") as client:
                return await run_pass(collector, client, judge, echo=said.append)
        finally:
            await collector.close()

    return seen, asyncio.run(run()), said


def test_with_no_scorer_a_pass_re_samples_nothing_and_says_why(tmp_path):
    db = tmp_path / "onjob.duckdb"
    logged(db, 3)
    seen, report, _ = judged(db, JudgeSettings(group_size=2))
    assert seen == []  # the engine was never asked
    assert report.turn_groups == 0 and report.no_scorer
    assert "no scorer" in report.summary()
    assert "add a reward function or a judge" in NO_SCORER


def test_re_samples_are_marked_background_and_users_requests_come_first(tmp_path):
    db = tmp_path / "onjob.duckdb"
    logged(db, 2)
    seen, report, _ = judged(db, JudgeSettings(group_size=2, rewards=fn("exact")))
    assert report.turn_groups == 2
    assert [body["priority"] for body in seen] == [BACKGROUND] * 2


def test_an_engine_without_priority_scheduling_is_asked_again_without_one(tmp_path):
    db = tmp_path / "onjob.duckdb"
    logged(db, 2)
    judge = JudgeSettings(group_size=2, rewards=fn("exact"))
    seen, report, _ = judged(db, judge, priorities=False)
    assert report.turn_groups == 2 and report.sampling_failed == 0
    assert sorted("priority" in body for body in seen) == [False, False, True, True]


def test_background_requests_wait_while_others_queue_in_the_engine_and_say_so(tmp_path):
    db = tmp_path / "onjob.duckdb"
    logged(db, 1)
    judge = JudgeSettings(group_size=2, rewards=fn("exact"))
    _, report, said = judged(db, judge, waiting=[2, 1])
    assert report.turn_groups == 1
    waits = [line for line in said if line.startswith("background work waits")]
    assert len(waits) == 1 and "2 other request(s) queued" in waits[0]


def test_a_background_wait_ends_at_its_limit_and_an_engine_without_metrics_is_not_waited_for():
    async def run(handler, most_wait_s):
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://e/v1") as client:
            admission = Admission(client, echo=lambda _: None, most_wait_s=most_wait_s)
            async with admission.admitted():
                pass
            return admission.waited_s

    always_busy = lambda _: httpx.Response(200, text="vllm:num_requests_waiting 5\n")  # noqa: E731
    assert asyncio.run(run(always_busy, 1.0)) == 1.5  # 0.5 s, then 1 s: past the limit
    assert asyncio.run(run(lambda _: httpx.Response(404), 60.0)) == 0.0


def test_a_clients_priority_never_reaches_the_engine(tmp_path):
    app, seen = recording_app(tmp_path)
    with TestClient(app) as client:
        resp = client.post("/v1/chat/completions", json={**CHAT, "priority": -100})
        assert resp.status_code == 200, resp.text
    ((_, sent),) = seen
    assert "priority" not in sent


def test_a_server_with_no_scorer_says_so_and_status_shows_the_loop(tmp_path, fake_engine_url):
    db = tmp_path / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0.5", "ONJOB_PROXY__ADMIN_KEY": "adm-loop"}
    admin = {"Authorization": "Bearer adm-loop"}
    args = ["--engine-url", fake_engine_url, "--db", str(db)]
    with ServerProcess(args, env=env, log=tmp_path / "server.log") as server:
        assert NO_SCORER in server.output()  # the start-up banner
        deadline = time.monotonic() + 60
        while (
            httpx.get(f"{server.base}/admin/status", headers=admin).json()["loop"]["last_iteration"]
            is None
        ):  # a probe: the loop's first iteration has ended
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.1)
        status = subprocess.run(
            [sys.executable, "-m", "onjob.cli", "status", "--server", server.base],
            env={**os.environ, "ONJOB_PROXY__ADMIN_KEY": "adm-loop"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        page = httpx.get(f"{server.base}/dashboard", headers=admin).text
    assert status.returncode == 0, status.stderr
    assert "loop: running, " in status.stdout and "scorer: none" in status.stdout
    assert re.search(r"\d+ iterations?, the last ended", status.stdout), status.stdout
    assert f"NO SCORER: {NO_SCORER}" in status.stdout
    assert "groups ready to train: 0 of 6" in status.stdout  # a cold start waits for 6
    assert 'id="no-scorer"' in page and "add a reward function or a judge" in page
    assert (
        "<code>[judge.rewards]</code>" in page and "`" not in page.split('id="no-scorer"')[1][:600]
    )
