"""`onjob.client` against a real `onjob serve` and a real engine: feedback with named
metrics, each a score source and a question for the judges of its own; the release verbs,
status, SQL, tables and a Parquet export, sync and async; the errors a program meets
(a refusal with the server's message, a wrong key, nothing listening)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess, free_port
from onjob.client import AsyncClient, Client, Refused, Unreachable
from onjob.collector import Store
from onjob.deploy.act import registry
from onjob.judge import JudgeSettings, RewardFn, judge_agreement

from .conftest import rows
from .test_judge_agreement import judge_passes

ADMIN_KEY = "adm-secret"
CONVERSATIONS = 12  # in one scenario: three trajectory groups of 4


def agrees(rollout) -> float:
    return int(rollout.metadata["k"]) / CONVERSATIONS


def parity(rollout) -> float:
    return int(rollout.metadata["k"]) % 2


def test_feedback_with_named_metrics_scores_and_checks_each_metric_on_its_own(tmp_path, engine):
    """Users post three metrics on each answer: unnamed (k/12), `resolved` (the reverse)
    and `thumbs` (k's parity). Each is its own score source, weighted by
    `judge.feedback_weights`, and each judge is checked against each metric apart: the
    judge that ranks by k agrees with the unnamed feedback and disagrees with `resolved`,
    which a mean of the metrics would have hidden."""
    db = tmp_path / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": ADMIN_KEY}
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
        chat = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        with Client(server.url, admin_key=ADMIN_KEY) as onjob:  # `/v1` or not, as given
            for k in range(CONVERSATIONS):
                answer = chat.chat.completions.create(
                    model="agent",
                    messages=[{"role": "user", "content": f"quiz question {k}"}],
                    max_tokens=2,
                    metadata={"scenario": "quiz", "k": str(k), "trajectory_id": f"quiz-{k}"},
                )
                onjob.feedback(k / CONVERSATIONS, exchange_id=answer.id)
                onjob.feedback(1 - k / CONVERSATIONS, exchange_id=answer.id, metric="resolved")
                said = onjob.feedback(k % 2, exchange_id=answer.id, metric="thumbs", comment="ok")
                assert (said.metric, said.value, said.comment) == ("thumbs", k % 2, "ok")
            for bad in ("", "two words", "../x", "x" * 65):
                with pytest.raises(Refused) as refused:
                    onjob.feedback(1.0, exchange_id=answer.id, metric=bad)
                assert refused.value.status == 400 and "metric" in refused.value.message
            with pytest.raises(Refused) as refused:
                onjob.feedback(1.0, exchange_id="chatcmpl-nope", metric="thumbs")
            assert refused.value.status == 404 and "chatcmpl-nope" in refused.value.message
            loaded = onjob.sql("SELECT metric, count(*) AS n FROM feedback GROUP BY 1 ORDER BY 1")
    assert loaded.rows == [["resolved", 12], ["thumbs", 12], [None, 12]]  # nothing refused

    settings = JudgeSettings(
        settle_s=0,
        max_trajectories=4,
        max_sample_tokens=1,  # no turn groups: in those only the logged answer has feedback
        rewards={name: RewardFn(fn=f"{__name__}:{name}") for name in ("agrees", "parity")},
        feedback_weights={"thumbs": 2.0, "resolved": 0.0},
    )
    asyncio.run(judge_passes(db, engine.url, settings, passes=3))

    scores = rows(
        db,
        "SELECT s.member_id, s.source, s.score, (m.trajectory_id) AS conversation "
        "FROM scores s JOIN members m ON m.id = s.member_id",
    )
    assert {s["source"] for s in scores} == {
        "fn:agrees",
        "fn:parity",
        "feedback",
        "feedback:resolved",
        "feedback:thumbs",
        "combined",
    }
    by_member: dict[str, dict[str, float]] = {}
    for s in scores:
        by_member.setdefault(s["member_id"], {})[s["source"]] = s["score"]
    assert len(by_member) == CONVERSATIONS
    for got in by_member.values():
        # Weights: fn:agrees 1, fn:parity 1, feedback 1, thumbs 2, resolved 0.
        weighted = (
            got["fn:agrees"] + got["fn:parity"] + got["feedback"] + 2 * got["feedback:thumbs"]
        )
        assert got["combined"] == pytest.approx(weighted / 5)
        assert got["feedback:resolved"] == pytest.approx(1 - got["feedback"])

    store = Store(db)
    try:
        found = {(a.judge, a.metric): a for a in judge_agreement(store, per_scenario=False)}
    finally:
        store.close()
    assert set(found) == {
        (judge, metric)
        for judge in ("fn:agrees", "fn:parity")
        for metric in (None, "resolved", "thumbs")
    }
    assert found["fn:agrees", None].verdict == "agrees" and found["fn:agrees", None].pairs == 18
    assert found["fn:agrees", "resolved"].verdict == "disagrees"
    assert found["fn:agrees", "resolved"].accuracy == 0.0
    assert "(users' resolved)" in found["fn:agrees", "resolved"].summary()
    thumbs = found["fn:parity", "thumbs"]
    assert (thumbs.accuracy, thumbs.pairs, thumbs.verdict) == (1.0, 12, "agrees")


def test_the_client_drives_the_release_and_reads_the_data_sync_and_async(
    tmp_path, engine, tiny_adapter_dir, tiny_model_dir
):
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, tiny_adapter_dir, "cand-1", tiny_model_dir)
    store.close()
    env = {"ONJOB_LOOP__INTERVAL_S": "30", "ONJOB_PROXY__ADMIN_KEY": ADMIN_KEY}
    try:
        with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
            chat = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
            for i in range(3):
                chat.chat.completions.create(
                    model="agent", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2
                )
            with Client(server.base, admin_key=ADMIN_KEY) as onjob:
                [checkpoint] = onjob.checkpoints()
                assert (checkpoint.name, checkpoint.status) == ("cand-1", "candidate")
                change = onjob.canary("cand-1", fraction=0.5, reason="try it")
                assert (change.model_alias, change.canary, change.fraction) == (
                    "agent",
                    "cand-1",
                    0.5,
                )
                status = onjob.status()
                assert status.aliases["agent"].canary == "cand-1"
                assert status.deployments[0].reason == "try it"
                assert onjob.promote(reason="it won").live == "cand-1"
                with pytest.raises(Refused) as refused:
                    onjob.rollback()
                assert refused.value.status == 409
                assert "no canary to roll back" in refused.value.message
                assert onjob.pause().paused is True
                assert onjob.resume().paused is False

                answer = onjob.sql("SELECT count(*) AS n FROM exchanges")
                assert (answer.columns, answer.rows) == (["n"], [[3]])
                with pytest.raises(Refused) as refused:
                    onjob.sql("DELETE FROM exchanges")
                assert refused.value.status == 400
                assert "exchanges" in onjob.tables()
                path = onjob.export("exchanges", tmp_path / "out" / "exchanges.parquet")
                assert not list(path.parent.glob("*.partial"))
                [(n,)] = duckdb.sql(f"SELECT count(*) FROM '{path}'").fetchall()
                assert n == 3

            with Client(server.base, admin_key="wrong") as stranger, pytest.raises(Refused) as r:
                stranger.status()
            assert r.value.status == 401

            async def from_asyncio():
                async with AsyncClient(server.url, admin_key=ADMIN_KEY) as onjob:
                    status, answer = await asyncio.gather(
                        onjob.status(), onjob.sql("SELECT count(*) AS n FROM deployments")
                    )
                    return status.aliases["agent"].live, answer.rows

            assert asyncio.run(from_asyncio()) == ("cand-1", [[2]])
    finally:
        import httpx

        httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": "cand-1"})

    nowhere = Client(f"http://127.0.0.1:{free_port()}", admin_key=ADMIN_KEY, timeout=5)
    with nowhere, pytest.raises(Unreachable, match="did not answer"):
        nowhere.status()


def test_the_cli_asks_through_the_client(tmp_path):
    """`onjob sql --server` with nothing listening there is refused with the client's
    words; no database is made."""
    import subprocess
    import sys

    onjob = str(Path(sys.executable).with_name("onjob"))
    nowhere = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [onjob, "sql", "SELECT 1", "--server", nowhere],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{nowhere} did not answer" in done.stderr
    assert not (tmp_path / "onjob.duckdb").exists()


def test_an_answer_the_client_cannot_read_is_a_client_error_not_a_traceback():
    """Another version's server, or something else at the address (scripted at the HTTP
    boundary): the error names the route and what was wrong."""
    import httpx

    from onjob.client import ClientError

    answers = {
        "/admin/status": httpx.Response(200, json={"aliases": "not a map"}),
        "/admin/tables": httpx.Response(200, text="<html>a login page</html>"),
        "/admin/checkpoints": httpx.Response(502, text="Bad Gateway"),
    }
    transport = httpx.MockTransport(lambda request: answers[request.url.path])
    with Client("http://onjob.test", admin_key="k", transport=transport) as onjob:
        for call, path in ((onjob.status, "/admin/status"), (onjob.tables, "/admin/tables")):
            with pytest.raises(ClientError, match=f"{path} answered what this client cannot"):
                call()
        with pytest.raises(Refused) as refused:
            onjob.checkpoints()
        assert (refused.value.status, refused.value.message) == (502, "Bad Gateway")
