"""One rule for what may be trained on (`onjob.logprobs.untrainable`, issue 36): an answer
is trainable only when its recorded logprob definition is raw_logprobs, unmasked, and each
choice's token ids and logprobs are as many as each other and add up to the engine's
`usage.completion_tokens`. Anything else is logged with its reason, counted in `/health`,
and no judge group or snapshot takes it (the snapshot side: tests/test_trainer_rules.py).
The engine is scripted at the HTTP boundary (httpx MockTransport), the database real."""

from __future__ import annotations

import json

import duckdb
import httpx
from litestar.testing import TestClient

from onjob.collector import Collector, CollectorSettings, Store
from onjob.collector.schema import MIGRATIONS, migrate
from onjob.judge import JudgeSettings
from onjob.judge.tables import turn_candidates
from onjob.logprobs import Untrainable, untrainable
from onjob.proxy import ProxySettings, create_app

from .conftest import rows
from .fake_engine import chunk, completion, scripted

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
STRICT = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]


def test_the_rule_case_by_case():
    ids, lps, usage = [[1, 2, 3]], [[-0.1, -0.2, -0.3]], {"completion_tokens": 3}
    assert untrainable("raw_logprobs", ids, lps, usage) is None
    assert untrainable("raw_logprobs", [[1, 2], [3]], [[-1, -1], [-1]], usage) is None  # n=2
    assert untrainable("raw_logprobs+grammar", ids, lps, usage) == Untrainable.MASKED
    assert untrainable("processed_logprobs", ids, lps, usage) == Untrainable.DEFINITION
    assert untrainable(None, ids, lps, usage) == Untrainable.DEFINITION
    assert untrainable("raw_logprobs", None, None, usage) == Untrainable.NO_TOKENS
    assert untrainable("raw_logprobs", ids, lps, None) == Untrainable.NO_USAGE
    assert untrainable("raw_logprobs", ids, [[-0.1, -0.2]], usage) == Untrainable.COUNT
    assert untrainable("raw_logprobs", ids, lps, {"completion_tokens": 4}) == Untrainable.COUNT
    # vLLM's floor for a token with no logprob entry is not a probability.
    assert untrainable("raw_logprobs", ids, [[-0.1, -9999.0, -0.3]], usage) == (
        Untrainable.NO_LOGPROB
    )


def _answer(ask: str, stream: bool) -> httpx.Response:
    if stream:
        # vLLM 0.11-0.12 drop a chunk a tool parser held back, its token ids and logprobs
        # with it, while usage still counts its token (serving_chat.py, fixed in 0.13).
        counted = 3 if ask == "dropped" else 2
        events = [
            chunk("a"),
            chunk("b", finish="stop"),
            chunk(usage={"prompt_tokens": 5, "completion_tokens": counted, "total_tokens": 7}),
            b"data: [DONE]\n\n",
        ]

        async def relayed():  # streamed as an engine streams, not one buffered body
            for event in events:
                yield event

        return httpx.Response(200, content=relayed(), headers={"content-type": "text/event-stream"})
    body = completion()
    if ask == "overcounted":
        body["usage"]["completion_tokens"] = 5
    if ask == "floor":
        body["choices"][0]["logprobs"]["content"][1]["logprob"] = -9999.0
    return httpx.Response(200, json=body)


def _engine():
    def chat(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return _answer(body["messages"][0]["content"], bool(body.get("stream")))

    return scripted(chat)


def test_answers_that_do_not_add_up_are_logged_untrainable_counted_and_never_judged(tmp_path):
    db = tmp_path / "onjob.duckdb"
    collector = Collector(CollectorSettings(db=db))
    asks = {
        "whole": {},
        "overcounted": {},
        "floor": {},
        "streamed": {"stream": True},
        "dropped": {"stream": True},
        "strict": {"tools": STRICT},  # vLLM decodes it under a structural tag
    }
    app = create_app(
        ProxySettings(aliases={"agent": None}, admin_key="adm-untrainable"),
        upstream=_engine(),
        collector=collector,
    )
    with TestClient(app) as client:
        for ask, more in asks.items():
            body = {"model": "agent", "messages": [{"role": "user", "content": ask}]}
            body.update(metadata={"ask": ask}, **more)
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        as_admin = {"Authorization": "Bearer adm-untrainable"}  # the counters are its alone
        health = client.get("/health", headers=as_admin).json()["collector"]["untrainable"]
    assert health == {"count": 2, "no_logprob": 1, "masked": 1}
    logged = {
        r["ask"]: r["untrainable"]
        for r in rows(
            db,
            "SELECT json_extract_string(metadata, '$.ask') AS ask, untrainable FROM exchanges",
        )
    }
    assert logged == {
        "whole": None,
        "overcounted": "count",
        "floor": "no_logprob",
        "streamed": None,
        "dropped": "count",
        "strict": "masked",
    }
    store = Store(db)
    try:
        judged = {c.id for c in turn_candidates(store, JudgeSettings(max_age_s=10**6))}
        trainable = {
            r["id"] for r in store.dicts("SELECT id FROM exchanges WHERE untrainable IS NULL")
        }
    finally:
        store.close()
    assert judged == trainable and len(judged) == 2


def test_rows_logged_before_the_rule_are_given_its_verdict_by_the_migration(tmp_path):
    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    migrate(con, MIGRATIONS[:12])  # as onjob left it before the rule
    old = [
        ("ok", "raw_logprobs", [[1, 2]], [[-1.0, -2.0]], 2),
        ("masked", "raw_logprobs+grammar", [[1, 2]], [[-1.0, -2.0]], 2),
        ("processed", "processed_logprobs", [[1, 2]], [[-1.0, -2.0]], 2),
        ("short", "raw_logprobs", [[1, 2]], [[-1.0, -2.0]], 3),
        ("torn", "raw_logprobs", [[1, 2]], [[-1.0]], 2),
        ("floor", "raw_logprobs", [[1, 2]], [[-1.0, -9999.0]], 2),
        ("none", "raw_logprobs", None, None, 2),
    ]
    for id, mode, ids, lps, n in old:
        con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, status, "
            "logprobs_mode, completion_token_ids, completion_logprobs, usage) "
            "VALUES (?, now(), 't', 0, 's', 200, ?, ?, ?, ?)",
            [id, mode, ids, lps, json.dumps({"completion_tokens": n})],
        )
    migrate(con)
    verdicts = dict(con.execute("SELECT id, untrainable FROM exchanges_full").fetchall())
    con.close()
    assert verdicts == {
        "ok": None,
        "masked": "masked",
        "processed": "definition",
        "short": "count",
        "torn": "count",
        "floor": "no_logprob",
        "none": "no_tokens",
    }
    # The SQL and the Python rule agree on every one of them.
    for id, mode, ids, lps, n in old:
        assert untrainable(mode, ids, lps, {"completion_tokens": n}) == verdicts[id], id


def test_a_streamed_reasoning_text_is_stored_with_the_answer_its_token_ids_belong_to(tmp_path):
    """A reasoning parser streams its text apart from `content` (`reasoning_content` on
    vLLM 0.11, `reasoning` later); its tokens are among the answer's token ids, so the
    stored answer keeps the text too, under the engine's name for it."""

    def event(delta: dict) -> bytes:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": [{"token": "t", "logprob": -0.5}]},
        }
        body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake"}
        return (
            b"data: "
            + json.dumps({**body, "choices": [{**choice, "token_ids": [42]}]}).encode()
            + b"\n\n"
        )

    def chat(request: httpx.Request) -> httpx.Response:
        key = json.loads(request.content)["messages"][0]["content"]

        async def events():
            yield event({key: "Two plus two "})
            yield event({key: "is four."})
            yield event({"content": "4"})
            yield chunk(usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=events(), headers={"content-type": "text/event-stream"})

    db = tmp_path / "onjob.duckdb"
    collector = Collector(CollectorSettings(db=db))
    app = create_app(
        ProxySettings(aliases={"agent": None}), upstream=scripted(chat), collector=collector
    )
    with TestClient(app) as client:
        for key in ("reasoning", "reasoning_content"):
            body = {
                "model": "agent",
                "messages": [{"role": "user", "content": key}],
                "stream": True,
            }
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    stored = rows(db, "SELECT response, untrainable FROM exchanges ORDER BY ts")
    messages = [json.loads(r["response"])["choices"][0]["message"] for r in stored]
    assert messages == [
        {"role": "assistant", "content": "4", "reasoning": "Two plus two is four."},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
    ]
    assert [r["untrainable"] for r in stored] == [None, None]
