"""Under load, an engine that errs, stalls, drops and cuts answers, and is killed and
restarted mid-run: `onjob serve` answers every request well-formed, keeps serving, falls
back from a failing canary to live, and loses no answered exchange.

Real processes on loopback: `onjob.testing.faulty_upstream` as the engine, `onjob serve`
with a canary and a 1 s read timeout, 16 concurrent clients for 15 s (`python -m
bench.proxy.faults` runs the same scenario for longer). Set ONJOB_FAULTS_SECONDS for a
longer run here.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import pytest

from onjob.cli.process import ServerProcess, free_port
from onjob.testing import faults
from onjob.testing.faulty_upstream import FaultyEngine

SECONDS = float(os.environ.get("ONJOB_FAULTS_SECONDS", "15"))


def test_engine_faults_under_load_get_well_formed_answers_and_lose_no_exchange(tmp_path):
    args = faults.parser().parse_args(["--seconds", str(SECONDS), "--concurrency", "16"])
    report = faults.run(tmp_path, args)
    restart = {k: v for k, v in report["restart"].items() if not k.startswith("engine_fates")}
    print(json.dumps({k: report[k] for k in ("requests", "requests_per_s", "answers")}))
    print(json.dumps({"restart": restart, "canary": report["canary"]}))
    print(json.dumps(report["db"]["rows_by_arm_and_status"]))

    # Every answer is a completion, a finished stream, or an OpenAI-shaped error; and the
    # clients saw each fault as such an error (500 passed on, 502 dropped or cut, 504 stalled).
    assert report["malformed"] == []
    assert report["answers"]["ok 200"] > 100
    seen = set(report["answers"])
    assert {"error 500", "error 502", "error 504", "stream_error 502", "stream_error 504"} <= seen

    # The server kept answering /health throughout, and is up at the end with a clean log.
    assert report["health"]["polls"] > 20 and report["health"]["failed"] == []
    assert report["health"]["server_up_at_end"]
    assert report["server_log_problems"] == []

    # The restart happened under load: requests meanwhile got 503s to retry (502 for those
    # the kill cut), and answers resumed.
    assert restart["answers_while_engine_down"].get("error 503", 0) > 0
    assert set(restart["answers_while_engine_down"]) <= {
        "error 503",
        "error 502",
        "stream_error 502",
    }
    assert restart["ok_after_restart"] > 0

    # The canary failed in every way (each kind of failed attempt is in the database) and
    # every failed attempt the client did not see was answered by live.
    canary, rows = report["canary"], report["db"]["rows_by_arm_and_status"]
    assert {"canary 500", "canary 502", "canary 504"} <= set(rows)
    assert canary["fell_back_to_live"]["ok 200"] > 0
    assert canary["fallbacks_without_a_failed_canary_row"] == []
    assert canary["failed_canary_attempts_not_retried_on_live"] == []
    assert canary["answered_by_canary"] > 0

    # Every exchange id a client received is in DuckDB with the status and arm it saw.
    db = report["db"]
    assert db["exchange_ids_received"] >= db["received_ok"] > 100
    assert db["missing"] == []
    assert db["status_or_arm_disagrees"] == []


@pytest.mark.parametrize("fate", ["error", "stall", "drop", "cut"])
def test_a_canary_that_fails_before_the_client_hears_anything_is_answered_by_live(tmp_path, fate):
    """Every canary attempt fails with `fate`: whole answers (and streams that fail before
    their first event) come from live, and both attempts are in the database."""
    engine_args = ["--fault-rate", "0", "--adapter-fault-rate", "1", "--mix", fate]
    engine_args += ["--stall-s", "3"]
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__READ_TIMEOUT_S": "0.5",
        "ONJOB_PROXY__CANARIES": json.dumps(
            {"agent": {"checkpoint": faults.CANARY, "fraction": 1.0}}
        ),
    }
    streams = [False] * 4 + [True] * 4 * (fate in ("error", "drop"))

    async def ask(base: str) -> list[faults.Answer]:
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(
                *(
                    faults.chat(session, base, stream=stream, trajectory=f"{fate}-{i}")
                    for i, stream in enumerate(streams)
                )
            )

    db = tmp_path / "onjob.duckdb"
    with FaultyEngine(free_port(), engine_args) as engine:
        args = ["--engine-url", engine.url, "--db", str(db)]
        with ServerProcess(args, env=env, log=tmp_path / "serve.log") as server:
            answers = asyncio.run(ask(server.base))
    assert [(a.kind, a.status, a.arm) for a in answers] == [("ok", 200, "live")] * len(streams)
    rows = faults.exchanges(db).values()
    for a in answers:
        arms = sorted((r["arm"], r["status"]) for r in rows if r["trajectory_id"] == a.trajectory)
        assert len(arms) == 2 and arms[0][0] == "canary" and arms[0][1] >= 400, arms
        assert arms[1] == ("live", 200)
    assert faults.server_problems(tmp_path / "serve.log") == []
