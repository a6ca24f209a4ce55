"""Linear storage (`collector/linear.py`): a later turn stores only what it adds, and every
reader gets the full request and prompt token ids back exactly as the client sent them and
the engine saw them. Real parts: a real `onjob serve` in front of the real local engine, the
real openai client, real DuckDB files; the judge's and the trainer's own queries read them."""

from __future__ import annotations

import asyncio
import json
import random
from array import array
from pathlib import Path

import duckdb
import msgspec
import pyarrow.parquet as pq
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.collector import (
    Collector,
    CollectorSettings,
    ExchangeRecord,
    Lineage,
    Store,
    queries,
)
from onjob.collector.forget import Forget, forget
from onjob.collector.linear import common_prefix, digest, stored
from onjob.collector.schema import MIGRATIONS, migrate
from onjob.collector.spool import Spool
from onjob.collector.trajectories import Keys, continuations, keys
from onjob.judge import JudgeSettings, tables
from onjob.trainer import snapshot
from onjob.trainer.settings import TrainSettings

from .conftest import placed_line

SYSTEM = {"role": "system", "content": "You answer in a few words."}


def converse(
    client: OpenAI,
    turns: int,
    *,
    system: dict = SYSTEM,
    rerender_at: int | None = None,
    ask: str = "Question",
) -> list[dict]:
    """A conversation of `turns` turns; returns per turn what the client sent and what the
    engine returned (prompt and completion token ids, asked for with return_token_ids).
    At `rerender_at` the client sends its first question again as content parts, as some
    clients re-render history (the stitcher still sees the same conversation)."""
    messages = [system]
    sent = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{ask} {turn}: say a number."})
        if turn == rerender_at:
            first = messages[1]
            messages[1] = {"content": [{"type": "text", "text": first["content"]}], "role": "user"}
        body = {"model": "agent", "messages": [dict(m) for m in messages], "max_tokens": 3}
        answer = client.chat.completions.create(
            **body, temperature=0, extra_body={"return_token_ids": True}
        ).to_dict()
        body["temperature"] = 0
        body["return_token_ids"] = True
        sent.append(
            {
                "request": body,
                "prompt": answer["prompt_token_ids"],
                "completion": answer["choices"][0]["token_ids"],
            }
        )
        messages.append(
            {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
        )
    return sent


@pytest.fixture(scope="module")
def logged(tmp_path_factory, engine) -> dict:
    """Two conversations through a real server: 20 turns, and 8 turns whose client re-renders
    its first question at turn 4."""
    db = tmp_path_factory.mktemp("linear") / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        long = converse(client, 20)
        other = {"role": "system", "content": "You answer at once."}
        rerendered = converse(client, 8, system=other, rerender_at=4)
        alike = converse(client, 3, ask="Another question")  # starts as `long` does
    return {"db": db, "long": long, "rerendered": rerendered, "alike": alike}


def _trajectory_of(store: Store, first_request: dict) -> str:
    for row in store.dicts("SELECT id, trajectory_id, request FROM exchanges_full"):
        if json.loads(row["request"]) == first_request:
            return row["trajectory_id"]
    raise AssertionError("the first turn is not in the database")


def _check(rows: list[dict], sent: list[dict]) -> None:
    assert len(rows) == len(sent)
    for row, mine in zip(rows, sent, strict=True):
        assert json.loads(row["request"]) == mine["request"]
        assert row["prompt_token_ids"] == mine["prompt"]
        assert row["completion_token_ids"][0] == mine["completion"]


def test_twenty_turns_are_stored_linearly_and_read_back_exactly(logged):
    store = Store(logged["db"])
    try:
        long = logged["long"]
        tid = _trajectory_of(store, long[0]["request"])
        stored_rows = store.dicts(
            "SELECT turn, parent_id, messages_kept, prompt_kept, len(prompt_token_ids) AS tail, "
            "json_array_length(request -> '$.messages') AS sent FROM exchanges "
            "WHERE trajectory_id = ? ORDER BY turn",
            [tid],
        )
        assert [r["turn"] for r in stored_rows] == list(range(20))
        assert stored_rows[0]["parent_id"] is None  # the first turn is stored whole
        for r in stored_rows[1:]:
            # Each later turn stores its new messages: the answer it re-sends, its question.
            assert r["parent_id"] is not None and r["sent"] == 2
            assert r["tail"] < len(long[r["turn"]]["prompt"]) / 2
        # What every reader gets: the collector's queries (the Responses API, the dashboard's
        # trajectory page), the view users query and export, the judge, the trainer.
        _check(queries.trajectory(store, tid), long)
        full = store.dicts(
            "SELECT * FROM exchanges_full WHERE trajectory_id = ? ORDER BY turn", [tid]
        )
        _check(full, long)
        for turn in (0, 7, 19):
            row = queries.exchange(store, full[turn]["id"])
            _check([msgspec.structs.asdict(row)], [long[turn]])
        candidates = tables.turn_candidates(store, JudgeSettings(per_scenario=100, max_groups=100))
        by_id = {c.id: c for c in candidates}
        for r, mine in zip(full, long, strict=True):
            assert json.loads(by_id[r["id"]].request) == mine["request"]
            assert by_id[r["id"]].prompt_token_ids == mine["prompt"]
    finally:
        store.close()


def test_a_client_that_re_renders_history_still_reads_back_exactly(logged):
    store = Store(logged["db"])
    try:
        sent = logged["rerendered"]
        tid = _trajectory_of(store, sent[0]["request"])
        _check(queries.trajectory(store, tid), sent)
        kept = store.dicts(
            "SELECT turn, messages_kept FROM exchanges WHERE trajectory_id = ? ORDER BY turn",
            [tid],
        )
        # The re-rendered first question differs from what the parent holds: that turn keeps
        # only the system prompt of it and stores the rest.
        assert kept[4]["messages_kept"] == 1
        assert kept[5]["messages_kept"] == 2 * 5
    finally:
        store.close()


def test_a_conversation_that_starts_as_another_stores_its_start_once(logged):
    store = Store(logged["db"])
    try:
        long, alike = logged["long"], logged["alike"]
        tid = _trajectory_of(store, alike[0]["request"])
        first = store.dicts(
            "SELECT parent_id, messages_kept, prompt_kept, prompt_token_ids, request "
            "FROM exchanges WHERE trajectory_id = ? AND turn = 0",
            [tid],
        )[0]
        # Stored against the opening it shares with `long`: the system prompt and the prompt
        # ids both conversations began with, held once.
        (opening,) = store.dicts("SELECT * FROM openings WHERE id = ?", [first["parent_id"]])
        assert json.loads(opening["request"]) == {"messages": [SYSTEM]}
        shared = opening["prompt_token_ids"]
        assert len(shared) > 10
        assert long[0]["prompt"][: len(shared)] == shared == alike[0]["prompt"][: len(shared)]
        assert first["messages_kept"] == 1 and first["prompt_kept"] == len(shared)
        assert json.loads(first["request"])["messages"] == alike[0]["request"]["messages"][1:]
        assert first["prompt_token_ids"] == alike[0]["prompt"][len(shared) :]
        _check(queries.trajectory(store, tid), alike)
        full = store.dicts(
            "SELECT * FROM exchanges_full WHERE trajectory_id = ? ORDER BY turn", [tid]
        )
        _check(full, alike)
    finally:
        store.close()


def test_the_judge_and_the_trainer_snapshot_see_full_requests_and_token_ids(logged, tmp_path):
    db = tmp_path / "copy.duckdb"
    db.write_bytes(Path(logged["db"]).read_bytes())
    store = Store(db)
    try:
        long, rerendered = logged["long"], logged["rerendered"]
        trajectories = [
            store.rows(
                tables.Finished,
                "SELECT id, scenario_id, last_exchange, NULL AS api_key_id FROM trajectories "
                "WHERE id = ?",
                [t],
            )[0]
            for t in (
                _trajectory_of(store, long[0]["request"]),
                _trajectory_of(store, rerendered[0]["request"]),
            )
        ]
        scenario = trajectories[0].scenario_id
        group = tables.add_trajectory_group(store, scenario, trajectories)
        members = tables.members_of(store, group)
        assert json.loads(members[0].request) == long[-1]["request"]
        assert json.loads(members[1].request) == rerendered[-1]["request"]
        tables.save_scores(
            store,
            group,
            status="scored",
            reason=None,
            judgements=[],
            scores=[
                (members[0].member_id, "combined", 1.0, None),
                (members[1].member_id, "combined", 0.0, None),
            ],
        )
        out = snapshot.export(store, tmp_path / "snap.parquet", TrainSettings())
        assert out.members == 2
        table = pq.read_table(tmp_path / "snap.parquet").to_pylist()
        for member, sent in zip(table, (long, rerendered), strict=True):
            assert member["prompt_ids"] == [t["prompt"] for t in sent]
            assert member["completion_ids"] == [t["completion"] for t in sent]
    finally:
        store.close()


def test_a_database_from_before_linear_storage_migrates_and_reads(tmp_path):
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    migrate(con, MIGRATIONS[:9])  # as onjob left it before V10
    request = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "hi"}]}
    con.execute(
        "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request, "
        "prompt_token_ids, completion_token_ids) VALUES ('old', now(), 't', 0, 's', ?, "
        "[1, 2, 3], [[4, 5]])",
        [json.dumps(request)],
    )
    con.close()
    store = Store(db)
    try:
        assert store.schema_before == 9
        row = queries.exchange(store, "old")
        assert json.loads(row.request) == request and row.prompt_token_ids == [1, 2, 3]
        assert row.parent_id is None  # kept whole, marked as such
        # A later turn stored against the old whole row rebuilds from it.
        later = {**request, "messages": [*request["messages"], {"role": "assistant"}]}
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request, "
            "prompt_token_ids, completion_token_ids, parent_id, messages_kept, prompt_kept) "
            "VALUES ('new', now(), 't', 1, 's', ?, [6], [[7]], 'old', 2, 5)",
            [json.dumps({**later, "messages": later["messages"][2:]})],
        )
        row = queries.exchange(store, "new")
        assert json.loads(row.request) == later
        assert row.prompt_token_ids == [1, 2, 3, 4, 5, 6]
    finally:
        store.close()


def test_lineage_memory_is_bounded_and_a_forgotten_conversation_is_stored_whole():
    lineage = Lineage(capacity=2, max_tokens=10)
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    digests = [digest(m) for m in messages]
    for i in range(3):
        lineage.remember(f"h{i}", None, f"e{i}", digests, {}, array("i", [1, 2, 3]), [4])
    assert len(lineage) == 2 and lineage.tokens == 8  # the oldest conversation went
    lineage.remember("big", None, "eb", digests, {}, array("i", range(9)), [1, 2])
    assert lineage.tokens <= 10
    body, ids, delta = stored(
        lineage,
        keys=Keys(["h0"], "p", "o", "k", "derived"),
        api_key_id=None,
        continuations=["h-next"],
        exchange_id="x",
        request={"messages": messages},
        prompt_token_ids=[1, 2, 3, 4, 9],
        completion_token_ids=[1],
        answered=True,
    )
    assert body is None and ids == [1, 2, 3, 4, 9] and delta.parent_id is None
    assert common_prefix(array("i", [1, 2, 3]), array("i", [1, 2, 4, 5])) == 2
    assert common_prefix(array("i", []), array("i", [1])) == 0


def test_openings_held_in_memory_are_bounded():
    lineage = Lineage(max_tokens=400)  # openings and their seeds: 100 token ids at most
    made = []
    for agent in range(30):
        system = {"role": "system", "content": f"agent {agent}"}
        for question in ("a", "b"):
            messages = [system, {"role": "user", "content": question}]
            prompt = array("i", [agent] * 40 + [ord(question)])
            delta = lineage.opening(
                None, {"messages": messages}, [digest(m) for m in messages], {}, prompt
            )
        made.append(delta)
    # Each agent's second conversation is stored against its opening (40 shared ids)...
    assert all(d.parent_id and d.messages_kept == 1 and d.prompt_kept == 40 for d in made)
    # ...and only the latest two are still held (3 x 40 ids would pass the bound).
    assert list(lineage.openings) == [made[-2].parent_id, made[-1].parent_id]
    lineage.clear()
    assert not lineage.openings


def test_spooled_deltas_load_and_rebuild_exactly_whatever_the_client_changes(tmp_path):
    """Seeded conversations through a real collector (its spool in small segments, its
    loader): tools sent each turn (left out as the parent's), then changed; history
    re-rendered or edited; prompts that re-tokenise the last answer differently
    (unaligned); failed turns retried; engines that return no token ids; conversations that
    start alike (stored against their opening, which each segment carries). Every row
    reads back exactly as sent."""
    rng = random.Random(7)
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * 300}}]
    opening_ids = [rng.randrange(9) for _ in range(40)]  # the rendered system prompt
    truth = {}

    async def conversation(collector: Collector, number: int, tools: list) -> list:
        tid = f"traj-{number}"
        messages = [SYSTEM]
        stream: list[int] = list(opening_ids)
        turn = 0
        while turn < 30:
            messages.append({"role": "user", "content": f"q{turn} " + "w" * rng.randint(0, 50)})
            if rng.random() < 0.1 and len(messages) > 2:  # re-rendered or edited history
                i = rng.randrange(1, len(messages) - 1)
                messages[i] = {**messages[i], "content": [{"type": "text", "text": "edited"}]}
            if rng.random() < 0.05:
                tools = [*tools, {"type": "function", "function": {"name": f"g{turn}"}}]
            if rng.random() < 0.2 and len(stream) > len(opening_ids):  # re-rendered answer
                cut = rng.randrange(len(opening_ids), len(stream))
                prompt = stream[:cut] + [rng.randrange(9) for _ in range(rng.randint(0, 5))]
            else:
                prompt = stream + [rng.randrange(9) for _ in range(rng.randint(1, 9))]
            if rng.random() < 0.1:
                prompt = None
            request = {"model": "m", "messages": [dict(m) for m in messages], "tools": tools}
            completion = [rng.randrange(9) for _ in range(rng.randint(1, 4))]
            failed = rng.random() < 0.1
            eid = f"e-{len(truth)}"
            k = keys(request["messages"])
            reply = {"role": "assistant", "content": f"a{turn}"}
            body, ids, delta = stored(
                collector.lineage,
                keys=k,
                api_key_id=None,
                continuations=continuations(k.prefix_hash, [reply]),
                exchange_id=eid,
                request=request,
                prompt_token_ids=prompt,
                completion_token_ids=None if failed else completion,
                answered=not failed,
            )
            collector.log(
                ExchangeRecord(
                    id=eid,
                    ts=float(turn),
                    trajectory_id=tid,
                    turn=turn,
                    scenario_id="s",
                    scenario_key="k",
                    scenario_keyed="derived",
                    status=502 if failed else 200,
                    request=msgspec.Raw(body or msgspec.json.encode(request)),
                    prompt_token_ids=ids,
                    completion_token_ids=None if failed else [completion],
                    parent_id=delta.parent_id,
                    messages_kept=delta.messages_kept,
                    prompt_kept=delta.prompt_kept,
                    request_kept=delta.request_kept,
                )
            )
            truth[eid] = (request, prompt)
            if rng.random() < 0.15:  # a load: the next lines go into a new segment
                loads.append(await collector.flush())
            if failed:
                messages.pop()
                continue
            stream = (prompt or []) + completion
            messages.append(reply)
            turn += 1
        return tools

    loads: list[int] = []

    async def log_and_load() -> tuple[dict, list[dict]]:
        collector = Collector(CollectorSettings(db=tmp_path / "db.duckdb", flush_interval_s=3600))
        await collector.start()
        try:
            latest = tools
            for number in range(8):
                # Most conversations start with the first tools; some with what one ended on.
                start = latest if number % 3 == 2 else tools
                latest = await conversation(collector, number, start)
            await collector.flush()
            counts = await collector.query(
                lambda store: store.dicts(
                    "SELECT count(*) FILTER (WHERE request_kept IS NOT NULL) AS left_out, "
                    "count(*) FILTER (WHERE parent_id IS NOT NULL) AS deltas, "
                    "count(*) FILTER (WHERE parent_id LIKE 'opn_%') AS opened, "
                    "(SELECT count(*) FROM openings) AS openings FROM exchanges"
                )[0]
            )
            full = await collector.query(
                lambda store: store.dicts(
                    "SELECT id, request, prompt_token_ids FROM exchanges_full"
                )
            )
        finally:
            await collector.close()
        return counts, full

    counts, full = asyncio.run(log_and_load())
    assert len(loads) > 20  # conversations and openings span many segments
    assert counts["left_out"] > 100 and counts["deltas"] > 200
    # The first conversation of a start is stored whole; later ones against its opening.
    assert counts["opened"] >= 5 and 1 <= counts["openings"] <= 3
    assert len(full) == len(truth)
    for row in full:
        request, prompt = truth[row["id"]]
        assert json.loads(row["request"]) == request, row["id"]
        assert row["prompt_token_ids"] == prompt, row["id"]


def test_a_turn_whose_parent_was_deleted_is_dropped_not_read_back_wrong(tmp_path):
    """A parent deleted while its next turns waited in the spool: those turns cannot be
    rebuilt, so the loader drops them (and only them)."""
    store = Store(tmp_path / "db.duckdb")
    spool = Spool(tmp_path / "spool")

    def line(eid: str, parent: str | None, turn: int) -> bytes:
        trajectory = "t" if parent or eid == "gone" else eid
        return placed_line(eid, parent, turn, trajectory=trajectory, content=eid, kept=0)

    try:
        spool.append(line("gone", None, 0))
        spool.rotate()
        (first,) = spool.loadable()
        store.load_segment(first.path)
        first.path.unlink()
        store.con.execute("DELETE FROM exchanges WHERE id = 'gone'")  # as forget would
        store.forgot()  # as forget does: the store no longer takes its recent loads as there
        for text in (line("child", "gone", 1), line("grandchild", "child", 2)):
            spool.append(text)
        spool.append(line("other", None, 0))
        spool.append(line("other-next", "other", 1))
        spool.rotate()
        (second,) = spool.loadable()
        assert store.load_segment(second.path) == 2 and store.orphaned == 2
        ids = {r["id"] for r in store.dicts("SELECT id FROM exchanges_full")}
        assert ids == {"other", "other-next"}
    finally:
        spool.close()
        store.close()


def test_a_turn_whose_parent_an_earlier_run_loaded_is_kept_and_rebuilt(tmp_path):
    """The loader finds a parent loaded before it started (not among the ids its own loads
    inserted) through the primary key's index, as it finds an opening: nothing is dropped."""
    db = tmp_path / "db.duckdb"

    def line(eid: str, parent: str | None, turn: int, content: str) -> bytes:
        return placed_line(eid, parent, turn, trajectory="t", content=content, kept=1)

    def load(*lines: bytes) -> Store:
        store, spool = Store(db), Spool(tmp_path / "spool")
        for text in lines:
            spool.append(text)
        spool.rotate()
        (segment,) = spool.loadable()
        assert store.load_segment(segment.path) == len(lines)
        segment.path.unlink()
        spool.close()
        return store

    load(line("it's-first", None, 0, "first")).close()  # a quote: the lookup's constants
    store = load(line("second", "it's-first", 1, "second"))
    try:
        assert store.orphaned == 0
        row = store.dicts(
            "SELECT request, prompt_token_ids FROM exchanges_full WHERE id = 'second'"
        )
        assert json.loads(row[0]["request"])["messages"] == [
            {"role": "user", "content": "first"},
            {"role": "user", "content": "second"},
        ]
        assert row[0]["prompt_token_ids"] == [0, 1]
    finally:
        store.close()


def _first_turn(collector: Collector, tid: str, api_key: str | None, question: str) -> tuple:
    """A conversation's first turn (a long system prompt and tools, rendered into 50 prompt
    ids every conversation shares), logged through `collector`; returns what was sent."""
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * 300}}]
    request = {
        "model": "m",
        "messages": [SYSTEM, {"role": "user", "content": question}],
        "tools": tools,
    }
    prompt = [*range(50), ord(tid[0])]
    k = keys(request["messages"])
    reply = {"role": "assistant", "content": "ok"}
    body, ids, delta = stored(
        collector.lineage,
        keys=k,
        api_key_id=api_key,
        continuations=continuations(k.prefix_hash, [reply]),
        exchange_id=f"e-{tid}",
        request=request,
        prompt_token_ids=prompt,
        completion_token_ids=[7],
        answered=True,
    )
    collector.log(
        ExchangeRecord(
            id=f"e-{tid}",
            ts=1.0,
            trajectory_id=tid,
            turn=0,
            scenario_id="s",
            scenario_key="k",
            scenario_keyed="derived",
            api_key_id=api_key,
            request=msgspec.Raw(body or msgspec.json.encode(request)),
            prompt_token_ids=ids,
            completion_token_ids=[[7]],
            parent_id=delta.parent_id,
            messages_kept=delta.messages_kept,
            prompt_kept=delta.prompt_kept,
            request_kept=delta.request_kept,
        )
    )
    return delta.parent_id, request, prompt


def test_conversations_that_start_alike_share_one_opening_until_none_is_left(tmp_path):
    """Conversations of one system prompt and tool set store their start once (an opening),
    per API key; a first turn spooled before its opening was deleted (`onjob forget` of the
    conversations that used it, while the turn waited in the spool) still loads and reads
    back exactly, because its segment carries the opening; the last conversation deleted
    takes the opening with it."""

    async def run() -> None:
        collector = Collector(CollectorSettings(db=tmp_path / "db.duckdb", flush_interval_s=3600))
        await collector.start()
        try:
            sent = {}
            parents = {}
            for tid, key in [("a", "k1"), ("b", "k1"), ("c", "k1"), ("x", "k2"), ("y", "k2")]:
                parents[tid], *sent[tid] = _first_turn(collector, tid, key, f"question {tid}?")
            assert parents["a"] is None and parents["x"] is None  # each key's first: whole
            assert parents["b"] == parents["c"] and parents["y"] not in (None, parents["b"])
            await collector.flush()

            def rows(store: Store) -> dict:
                return {
                    r["trajectory_id"]: r
                    for r in store.dicts(
                        "SELECT trajectory_id, request, prompt_token_ids FROM exchanges_full"
                    )
                }

            def openings(store: Store) -> set[str]:
                return {r["id"] for r in store.dicts("SELECT id FROM openings")}

            def check(got: dict) -> None:
                for tid, row in got.items():
                    assert json.loads(row["request"]) == sent[tid][0], tid
                    assert row["prompt_token_ids"] == sent[tid][1], tid

            check(await collector.query(rows))
            assert await collector.query(openings) == {parents["b"], parents["y"]}
            stored_b = await collector.query(
                lambda s: s.dicts("SELECT request, prompt_token_ids FROM exchanges WHERE id='e-b'")
            )
            assert json.loads(stored_b[0]["request"]) == {
                "model": "m",
                "messages": [{"role": "user", "content": "question b?"}],
            }
            assert stored_b[0]["prompt_token_ids"] == [ord("b")]

            # A first turn waits in the spool while every conversation that used its opening
            # is deleted (as `onjob forget` does on a stopped server's file).
            parents["d"], *sent["d"] = _first_turn(collector, "d", "k1", "question d?")
            assert parents["d"] == parents["b"]
            for tid in ("b", "c"):
                await collector.query(lambda s, t=tid: forget(s, Forget(trajectory=t)))
            assert await collector.query(openings) == {parents["y"]}
            await collector.flush()
            got = await collector.query(rows)
            assert set(got) == {"a", "d", "x", "y"}
            check(got)
            # The whole first conversation is not stored against the opening: deleting it
            # leaves it; deleting the last that is takes it.
            await collector.query(lambda s: forget(s, Forget(trajectory="a")))
            assert parents["b"] in await collector.query(openings)
            out = await collector.query(lambda s: forget(s, Forget(trajectory="d")))
            assert out.openings == 1 and await collector.query(openings) == {parents["y"]}
            out = await collector.query(lambda s: forget(s, Forget(api_key="k2")))
            assert out.exchanges == 2 and out.openings == 1
            assert await collector.query(openings) == set()
        finally:
            await collector.close()

    asyncio.run(run())
