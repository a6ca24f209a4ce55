"""The swap-`base_url` promise, end to end: a real engine process, a real `onjob serve`
process, the official `openai` client (sync, async, streaming, tools) and LangChain;
then the DuckDB file is opened and every exchange is found, stitched and scored."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from onjob.cli.process import ServerProcess

from .conftest import TOOL_QUESTION, TOOLS, rows
from .fake_engine import RawEngine, chunk, send_chunk, send_chunked_head


def clients(server: ServerProcess) -> tuple[OpenAI, AsyncOpenAI]:
    kw = {"base_url": server.url, "api_key": "unused", "max_retries": 0, "timeout": 120}
    return OpenAI(**kw), AsyncOpenAI(**kw)


def next_messages(messages: list[dict], reply: dict, turn: int) -> list[dict]:
    """What an agent sends next: its history, the reply, then tool results or a user turn."""
    out = [*messages, reply]
    for call in reply.get("tool_calls") or []:
        args = json.loads(call["function"]["arguments"])
        out.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": json.dumps({"city": args.get("city"), "celsius": 21}),
            }
        )
    if not reply.get("tool_calls"):
        out.append({"role": "user", "content": f"And the day after? ({turn})"})
    return out


def test_tool_using_agent_conversations_land_stitched_with_tokens_and_feedback(
    tmp_path, tool_engine
):
    db = tmp_path / "onjob.duckdb"
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)]) as server:
        client, aclient = clients(server)
        params = {"tools": TOOLS, "max_tokens": 24, "temperature": 0}

        def sync_call(messages, **extra):
            r = client.chat.completions.create(model="agent", messages=messages, **params, **extra)
            assert r.choices[0].logprobs is None  # not asked: stripped
            assert "token_ids" not in (r.choices[0].model_extra or {})
            return r.id, r.choices[0].message.model_dump(exclude_none=True)

        def stream_call(messages):
            content, calls, ids = "", {}, set()
            stream = client.chat.completions.create(
                model="toolbot", messages=messages, stream=True, **params
            )
            for c in stream:
                ids.add(c.id)
                assert c.model == "toolbot"
                for d in c.choices:
                    content += d.delta.content or ""
                    for tc in d.delta.tool_calls or []:
                        # As OpenAI streams a call: id and name first, then argument pieces.
                        call = calls.setdefault(
                            tc.index,
                            {
                                "id": tc.id,
                                "type": "function",
                                "function": {"name": "", "arguments": ""},
                            },
                        )
                        call["function"]["name"] += tc.function.name or ""
                        call["function"]["arguments"] += tc.function.arguments or ""
            (exchange_id,) = ids
            reply = {"role": "assistant", "content": content}
            if calls:
                reply["tool_calls"] = [calls[i] for i in sorted(calls)]
            return exchange_id, reply

        async def async_conversation():
            messages, ids = list(TOOL_QUESTION), []
            for turn in range(3):
                r = await aclient.chat.completions.create(
                    model="agent", messages=messages, **params
                )
                ids.append(r.id)
                messages = next_messages(
                    messages, r.choices[0].message.model_dump(exclude_none=True), turn
                )
            return ids

        def conversation(call, **extra):
            messages, ids = list(TOOL_QUESTION), []
            for turn in range(3):
                exchange_id, reply = call(messages, **extra)
                ids.append(exchange_id)
                messages = next_messages(messages, reply, turn)
            return ids

        conversations = {
            "sync": conversation(sync_call),
            "stream": conversation(stream_call),
            "async": asyncio.run(async_conversation()),
            "named": conversation(
                sync_call,
                metadata={"scenario": "weather-named"},
                extra_headers={"X-Onjob-Trajectory": "conv-named-1"},
            ),
        }
        first_turn = conversations["sync"][0]
        feedback = httpx.post(
            f"{server.url}/feedback",
            json={"exchange_id": first_turn, "value": 1, "comment": "right tool"},
        )
        assert feedback.status_code == 200, feedback.text
        by_trajectory = httpx.post(
            f"{server.url}/feedback",
            json={"trajectory_id": "conv-named-1", "value": -1},
        )
        assert by_trajectory.status_code == 200, by_trajectory.text

    logged = {r["id"]: r for r in rows(db, "SELECT * FROM exchanges_full")}
    assert set(logged) == {i for ids in conversations.values() for i in ids}
    trajectories = set()
    for name, ids in conversations.items():
        exchanges = [logged[i] for i in ids]
        assert [e["turn"] for e in exchanges] == [0, 1, 2], name
        assert len({e["trajectory_id"] for e in exchanges}) == 1, name
        assert all(e["status"] == 200 for e in exchanges)
        trajectories.add(exchanges[0]["trajectory_id"])
        # The first turn of every conversation is the tool call the model was taught.
        first = json.loads(exchanges[0]["response"])["choices"][0]["message"]
        assert first["tool_calls"][0]["function"]["name"] == "get_weather", name
        assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
        for e in exchanges:
            usage = json.loads(e["usage"])
            assert len(e["prompt_token_ids"]) == usage["prompt_tokens"]
            (tokens,), (logprobs,) = e["completion_token_ids"], e["completion_logprobs"]
            assert len(tokens) == len(logprobs) == usage["completion_tokens"] > 0
            assert all(lp <= 0 for lp in logprobs)
    assert len(trajectories) == 4 and "conv-named-1" in trajectories
    assert logged[conversations["stream"][0]]["stream"] is True
    assert logged[conversations["stream"][0]]["model_alias"] == "toolbot"

    # Three conversations opened the same way share a derived scenario; one is named.
    scenario_of = {n: logged[ids[0]]["scenario_id"] for n, ids in conversations.items()}
    assert scenario_of["sync"] == scenario_of["stream"] == scenario_of["async"]
    scenarios = {r["id"]: r for r in rows(db, "SELECT * FROM scenarios")}
    assert scenarios[scenario_of["sync"]]["count"] == 3
    assert scenarios[scenario_of["sync"]]["keyed"] == "derived"
    named = scenarios[scenario_of["named"]]
    assert (named["key"], named["keyed"], named["count"]) == ("weather-named", "explicit", 1)
    assert {r["n_turns"] for r in rows(db, "SELECT n_turns FROM trajectories")} == {3}

    feedback_rows = rows(db, "SELECT * FROM feedback ORDER BY ts")
    assert [(f["exchange_id"], f["value"], f["comment"]) for f in feedback_rows] == [
        (first_turn, 1.0, "right tool"),
        (None, -1.0, None),
    ]
    assert feedback_rows[0]["trajectory_id"] == logged[first_turn]["trajectory_id"]
    assert feedback_rows[1]["trajectory_id"] == "conv-named-1"


def test_langchain_chat_openai_and_n_choices_through_the_proxy(tmp_path, engine):
    from langchain_openai import ChatOpenAI

    db = tmp_path / "onjob.duckdb"
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)]) as server:
        llm = ChatOpenAI(
            base_url=server.url, api_key="unused", model="agent", max_tokens=8, max_retries=0
        )
        said = llm.invoke("Hello there").content
        streamed = "".join(c.content for c in llm.stream("Tell me more"))
        client, _ = clients(server)
        many = client.chat.completions.create(
            model="agent",
            messages=[{"role": "user", "content": "Three ways"}],
            n=3,
            max_tokens=6,
            logprobs=True,
        )
    assert len(many.choices) == 3
    assert all(len(c.logprobs.content) == 6 for c in many.choices)
    logged = rows(db, "SELECT stream, response, completion_token_ids FROM exchanges ORDER BY ts")
    assert [r["stream"] for r in logged] == [False, True, False]
    contents = [json.loads(r["response"])["choices"][0]["message"]["content"] for r in logged]
    assert contents[:2] == [said, streamed]
    assert [len(ids) for ids in logged[2]["completion_token_ids"]] == [6, 6, 6]


def test_stream_is_relayed_as_it_arrives(tmp_path):
    gate = threading.Event()
    held = []

    def engine(conn, body):
        send_chunked_head(conn)
        send_chunk(conn, chunk("first"))
        # The rest is held back until the client has seen the first token: a proxy that
        # buffered the answer would never let the client get that far.
        held.append(gate.wait(60))
        send_chunk(conn, chunk(" second", finish="stop"))
        usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        send_chunk(conn, chunk(usage=usage))
        send_chunk(conn, b"data: [DONE]\n\n")
        send_chunk(conn, b"")

    fake = RawEngine(engine)
    try:
        with ServerProcess(["--engine-url", fake.url, "--db", str(tmp_path / "o.duckdb")]) as s:
            client, _ = clients(s)
            stream = client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            first = next(stream)
            assert first.choices[0].delta.content == "first"
            gate.set()
            rest = [c.choices[0].delta.content for c in stream]
    finally:
        fake.close()
    assert held == [True]
    assert rest == [" second"]  # and the usage chunk the proxy asked for is not passed on


def test_client_that_hangs_up_mid_stream_is_logged_as_499_with_its_partial_answer(tmp_path):
    hung_up = threading.Event()

    def engine(conn, body):
        send_chunked_head(conn)
        send_chunk(conn, chunk("partial"))
        hung_up.wait(60)
        try:
            for _ in range(50):  # the proxy drops the engine's connection when the client goes
                send_chunk(conn, chunk(" more"))
                time.sleep(0.05)
        except OSError:
            pass

    fake = RawEngine(engine)
    db = tmp_path / "o.duckdb"
    try:
        with ServerProcess(["--engine-url", fake.url, "--db", str(db)]) as server:
            client, _ = clients(server)
            stream = client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            assert next(stream).choices[0].delta.content == "partial"
            stream.close()
            hung_up.set()
            assert server.proc.poll() is None
    finally:
        fake.close()
    (row,) = rows(db, "SELECT status, error, response FROM exchanges")
    assert row["status"] == 499 and "client closed" in row["error"]
    assert json.loads(row["response"])["choices"][0]["message"]["content"].startswith("partial")


def test_a_base_url_without_v1_is_told_where_the_api_is(tmp_path, fake_engine_url):
    """Was a bare "Not Found": the openai client's commonest mistake here."""
    import openai

    args = ["--engine-url", fake_engine_url, "--db", str(tmp_path / "onjob.duckdb")]
    with ServerProcess(args, env={"ONJOB_LOOP__INTERVAL_S": "0"}) as server:
        client = OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.NotFoundError) as got:
            client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": "hi"}]
            )
        elsewhere = httpx.get(f"{server.base}/v1/nothing", timeout=30)
    assert got.value.body["message"] == (
        "no route POST /chat/completions: the OpenAI API is under /v1 (set the client's "
        f"base_url to {server.base}/v1)"
    )
    assert elsewhere.status_code == 404
    assert elsewhere.json()["error"]["message"] == "no route GET /v1/nothing"
