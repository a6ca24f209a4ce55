"""The log in DuckLake, its ground: DuckDB's extensions loaded from the installed wheels,
a lake whose catalog is a real Postgres cluster (Debian's package, on a free port), the
embedded schema's end state made in it, and writers in several processes at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import duckdb
import httpx
import openai
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from onjob.cli.process import ServerProcess
from onjob.collector import CollectorSettings, Store, extensions, jobs, lake, schema
from onjob.collector import store as store_module
from onjob.collector.errors import StorageError
from onjob.collector.forget import Forget, forget
from onjob.collector.spool import Spool
from onjob.collector.store import Placed
from onjob.collector.trajectories import Keys, Stitcher
from onjob.deploy.act import registry
from onjob.testing.postgres import Postgres

from .conftest import placed_line
from .s3_server import bucket_url, s3_endpoint  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def postgres():
    with Postgres() as pg:
        yield pg


@pytest.fixture
def catalog(postgres):
    """A database of its own in the cluster for each test: a lake's catalog."""
    return postgres.database(f"lake_{uuid.uuid4().hex[:12]}")


class Hosts:
    """`onjob serve`s on one lake before one engine, each with its own spool and log in
    `tmp_path`: the hosts a load balancer spreads an agent's traffic over. `env` adds to
    (or overrides) the settings every one gets; `server(name, **env)` one's own."""

    def __init__(
        self, tmp_path, catalog: str, data_path: str, engine_url: str, *args: str, **env: str
    ):
        self.tmp, self.engine_url, self.args = tmp_path, engine_url, args
        self.key = f"adm-lake-{uuid.uuid4().hex[:8]}"
        self.admin = {"Authorization": f"Bearer {self.key}"}
        self.env = {
            "ONJOB_LOOP__INTERVAL_S": "0",
            "ONJOB_PROXY__ADMIN_KEY": self.key,
            "ONJOB_COLLECTOR__CATALOG": catalog,
            "ONJOB_COLLECTOR__DATA_PATH": data_path,
        } | env

    def server(self, name: str, **env: str) -> ServerProcess:
        args = [*self.args, "--engine-url", self.engine_url]
        args += ["--db", str(self.tmp / f"{name}.duckdb")]
        return ServerProcess(args, env=self.env | env, log=self.tmp / f"{name}.log")

    def status(self, s: ServerProcess) -> dict:
        return httpx.get(f"{s.base}/admin/status", headers=self.admin, timeout=30).json()


def test_the_extensions_load_from_the_installed_wheels_for_this_duckdb():
    file = extensions.path("ducklake")
    assert file.parent.name == f"v{duckdb.__version__}" and "site-packages" in str(file)
    con = duckdb.connect()
    extensions.load(con, "ducklake", "postgres", "httpfs")
    loaded = {
        name
        for (name,) in con.execute(
            "SELECT extension_name FROM duckdb_extensions() WHERE loaded"
        ).fetchall()
    }
    assert {"ducklake", "postgres_scanner", "httpfs"} <= loaded


def test_a_missing_extension_names_the_wheel_to_install():
    with pytest.raises(extensions.ExtensionMissing) as caught:
        extensions.path("spatial")
    assert f"duckdb-extension-spatial=={duckdb.__version__}" in str(caught.value)


def _columns(con: duckdb.DuckDBPyConnection, database: str) -> set[tuple]:
    """Each column's table, name, type, nullability and default (DuckLake states "no
    default" as NULL, and a number's as a quoted text: `'0'`)."""
    return {
        (*column[:4], None if column[4] in (None, "NULL") else column[4].strip("'"))
        for column in con.execute(
            """
            SELECT table_name, column_name, data_type, is_nullable, column_default
            FROM duckdb_columns() WHERE database_name = ? AND table_name IN (
                SELECT table_name FROM duckdb_tables() WHERE database_name = ?)
            """,
            [database, database],
        ).fetchall()
    }


def test_a_new_lake_gets_the_embedded_schemas_end_state(catalog, tmp_path):
    embedded = duckdb.connect()
    schema.migrate(embedded)
    con = duckdb.connect()
    lake.attach(con, catalog, str(tmp_path / "data"))
    assert lake.migrate(con) == 0
    assert lake.migrate(con) == len(schema.MIGRATIONS)  # made once; again, nothing to do
    # Every table of the file's, as the file has it (the two every load updates as parts
    # only appended, each read through a view of the table's name: `lake.PARTS`); and the
    # leader's lease, the lake's own.
    parts = {part: table for table, part in lake.PARTS.items()}
    in_lake = {(parts.get(c[0], c[0]), *c[1:]) for c in _columns(con, lake.NAME)}
    assert {c for c in in_lake if c[0] != "lake_writer"} == _columns(embedded, "memory")
    assert {c[1] for c in in_lake if c[0] == "lake_writer"} == {"holder", "until"}
    for table in lake.PARTS:  # the views read with the table's columns and types
        shape = (
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? "
            "ORDER BY column_index"
        )
        assert con.execute(shape, [table]).fetchall() == embedded.execute(shape, [table]).fetchall()
    # Defaults fill in as in the file: a number's a number, a text's its text.
    con.execute("INSERT INTO groups (id, kind, status) VALUES ('g', 'turn', 'new')")
    assert con.execute("SELECT attempts FROM groups").fetchone() == (0,)
    con.execute("DELETE FROM groups")
    con.close()
    # Another connection (another host) attaches the same lake and finds it made.
    other = duckdb.connect()
    lake.attach(other, catalog, str(tmp_path / "data"), read_only=True)
    assert other.execute("SELECT max(version) FROM schema_version").fetchone() == (
        len(schema.MIGRATIONS),
    )
    assert other.execute("SELECT count(*) FROM exchanges_full").fetchone() == (0,)


def test_a_lake_of_another_schema_version_is_refused_not_rewritten(catalog, tmp_path):
    con = duckdb.connect()
    lake.attach(con, catalog, str(tmp_path / "data"))
    lake.migrate(con)
    con.execute("INSERT INTO schema_version VALUES (?)", [len(schema.MIGRATIONS) + 1])
    with pytest.raises(StorageError, match="schema version"):
        lake.migrate(con)
    assert con.execute("SELECT count(*) FROM exchanges").fetchone() == (0,)


def _line(eid: str, parent: str | None, turn: int, content: str) -> bytes:
    """Trajectory `t`'s line (`x` its own), keeping the whole conversation before it."""
    trajectory = "x" if eid == "x" else "t"
    return placed_line(eid, parent, turn, trajectory=trajectory, content=content, kept=turn)


def _load(store: Store, spool_dir, *lines: bytes) -> int:
    spool = Spool(spool_dir)
    for line in lines:
        spool.append(line)
    spool.rotate()
    (segment,) = spool.loadable()
    loaded = store.load_segment(segment.path)
    segment.path.unlink()
    spool.close()
    return loaded


def _tables(store: Store) -> dict[str, list]:
    return {
        "exchanges_full": store.con.execute(
            "SELECT id, trajectory_id, turn, request, prompt_token_ids FROM exchanges_full "
            "ORDER BY id"
        ).fetchall(),
        "trajectories": store.con.execute(
            "SELECT * EXCLUDE (first_ts, last_ts) FROM trajectories ORDER BY id"
        ).fetchall(),
        "scenarios": store.con.execute(
            "SELECT * EXCLUDE (first_seen) FROM scenarios ORDER BY id"
        ).fetchall(),
    }


def test_spool_segments_load_into_a_lake_as_into_the_file(catalog, tmp_path):
    """The loader on a lake: the same segments, loaded one after another into the file and
    into a lake, leave the same conversations, trajectories (merged by id where the file
    upserts by its key) and scenarios; a conversation stored turn by turn against its
    parent rebuilds the same through the lake's macro and view."""
    file = Store(tmp_path / "db.duckdb")
    lake_store = Store(tmp_path / "lake.duckdb", catalog=catalog, data_path=str(tmp_path / "d"))
    first = (_line("a", None, 0, "first"), _line("x", None, 0, "other"))
    second = (_line("b", "a", 1, "second"), _line("c", "b", 2, "third"))
    try:
        for store, spool in ((file, "spool-file"), (lake_store, "spool-lake")):
            assert _load(store, tmp_path / spool, *first) == 2
            assert _load(store, tmp_path / spool, *second) == 2
        assert _tables(lake_store) == _tables(file)
        (turns,) = lake_store.con.execute(
            "SELECT n_turns FROM trajectories WHERE id = 't'"
        ).fetchone()
        assert turns == 3
        row = lake_store.dicts(
            "SELECT request, prompt_token_ids FROM exchanges_full WHERE id = 'c'"
        )
        assert [m["content"] for m in json.loads(row[0]["request"])["messages"]] == [
            "first", "second", "third"
        ]  # fmt: skip
        assert row[0]["prompt_token_ids"] == [0, 1, 2]
        # A lake keeps no ledger of segments: one replayed (a crash between its commit and
        # its removal) drops the lines already in, by their ids.
        spool = Spool(tmp_path / "spool-replay")
        spool.append(_line("y", None, 0, "once"))
        spool.rotate()
        (segment,) = spool.loadable()
        assert [lake_store.load_segment(segment.path) for _ in range(2)] == [1, 0]
        assert lake_store.dicts("SELECT count(*) AS n FROM exchanges WHERE id = 'y'") == [{"n": 1}]
        spool.close()
    finally:
        file.close()
        lake_store.close()


def test_every_server_writes_a_lake_and_one_leads_at_a_time(catalog, tmp_path):
    """The leader's lease: a command that must lead (`onjob forget --db`) is
    refused while a server leads, naming it; a server that does not lead still commits its
    loads; the lease passes on once the leader stops, or once a leader that stopped renewing
    (a dead host) has let it run out."""
    data = str(tmp_path / "d")
    first = Store(tmp_path / "a.duckdb", catalog=catalog, data_path=data)
    with pytest.raises(StorageError, match="another onjob leads this DuckLake") as refused:
        Store(tmp_path / "b.duckdb", catalog=catalog, data_path=data)
    assert first.holder in str(refused.value)
    follower = Store(tmp_path / "b.duckdb", catalog=catalog, data_path=data, follow=True)
    spool = Spool(tmp_path / "spool")
    spool.append(_line("a", None, 0, "first"))
    spool.rotate()
    (segment,) = spool.loadable()
    try:
        assert first.leading and not follower.leading and follower.leader == first.holder
        assert follower.load_segment(segment.path) == 1
        assert first.dicts("SELECT count(*) AS n FROM exchanges")[0]["n"] == 1
        first.close()
        follower.keep_lease()
        assert follower.leading
        follower.close()
        second = Store(tmp_path / "c.duckdb", catalog=catalog, data_path=data, lease_s=1)
        # The second stops renewing, as a host that died would; a third waits out its lease.
        time.sleep(1.2)
        third = Store(tmp_path / "d.duckdb", catalog=catalog, data_path=data)
        assert third.leading
        second.keep_lease()
        assert not second.leading and second.leader == third.holder
        second.close()
        third.close()
    finally:
        spool.close()


def _files_holding(root, text: bytes) -> list:
    return [f for f in root.rglob("*") if f.is_file() and text in f.read_bytes()]


def _objects_holding(data_path: str, endpoint: str, text: bytes) -> list:
    import boto3

    bucket, _, prefix = data_path.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return [k for k in keys if text in s3.get_object(Bucket=bucket, Key=k)["Body"].read()]


@pytest.fixture(params=["directory", "s3"])
def data_path(request, tmp_path, monkeypatch):
    """Where a lake's files go, and what finds the files that hold a text: a directory, or
    a bucket of moto's S3 server (DuckDB given its key and endpoint by the AWS variables)."""
    if request.param == "directory":
        return str(tmp_path / "d"), lambda text: _files_holding(tmp_path / "d", text)
    endpoint = request.getfixturevalue("s3_endpoint")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    url = request.getfixturevalue("bucket_url") + "/lake/"
    return url, lambda text: _objects_holding(url, endpoint, text)


def test_a_conversation_forgotten_on_a_lake_is_nowhere_in_it(
    postgres, catalog, tmp_path, data_path
):
    """`onjob forget` on a lake: the conversation's text is in no snapshot, no data file
    and no statistic of the catalog (`pg_dump` of its Postgres database), and the other
    conversations read back whole, found by the filters that statistics prune by."""
    path, holding = data_path
    store = Store(tmp_path / "lake.duckdb", catalog=catalog, data_path=path)
    secret = "zz-the-secret-address"  # the largest text of its columns: their maximum
    try:
        _load(store, tmp_path / "spool", _line("a", None, 0, "first"), _line("x", None, 0, secret))
        _load(store, tmp_path / "spool", _line("b", "a", 1, "second"))
        # Enough rows beside it that DuckLake writes a data file, not only catalog rows.
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request) "
            "SELECT 'bulk-' || i, now(), 'x', 1, 's', '{\"q\": \"zz-the-secret-address\"}' "
            "FROM range(3000) r(i)"
        )
        before = postgres.dump(catalog.split("dbname=")[1])
        assert secret in before and holding(secret.encode())
        forgotten = forget(store, Forget(trajectory="x"))
        assert forgotten.exchanges == 3001 and forgotten.checkpointed
        assert secret not in postgres.dump(catalog.split("dbname=")[1])
        assert holding(secret.encode()) == []
        with pytest.raises(duckdb.InvalidInputException, match="No snapshot"):
            store.con.execute("SELECT count(*) FROM exchanges AT (VERSION => 1)")
        rows = store.dicts("SELECT id, request FROM exchanges_full ORDER BY id")
        assert [r["id"] for r in rows] == ["a", "b"]
        assert [m["content"] for m in json.loads(rows[1]["request"])["messages"]] == [
            "first", "second"
        ]  # fmt: skip
        # The statistics measured again still bound what is there: a filter finds it.
        (found,) = store.con.execute(
            "SELECT count(*) FROM exchanges WHERE request::VARCHAR >= '{\"messages\"'"
        ).fetchone()
        assert found == 2
    finally:
        store.close()


def test_a_forget_holds_while_another_server_commits_beside_it(postgres, catalog, tmp_path):
    """Two servers on one lake: the leader forgets a conversation whose text is its column's
    largest while the other has a load open; that load, committed after the forget, puts
    no statistic of the forgotten text back into the catalog."""
    data = str(tmp_path / "d")
    leader = Store(tmp_path / "a.duckdb", catalog=catalog, data_path=data)
    writer = Store(tmp_path / "b.duckdb", catalog=catalog, data_path=data, follow=True)
    secret = "zz-the-secret-address"
    database = catalog.split("dbname=")[1]
    try:
        _load(leader, tmp_path / "spool", _line("a", None, 0, "first"), _line("x", None, 0, secret))
        # Rows enough for data files, not only rows inlined in the catalog, on both sides.
        bulk = (
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request) "
            "SELECT '{0}-' || i, now(), '{0}', 1, 's', '{{\"q\": \"{1}\"}}' FROM range(3000) r(i)"
        )
        leader.con.execute(bulk.format("x", secret))
        writer.con.execute("BEGIN TRANSACTION")
        writer.con.execute(bulk.format("y", "an answer"))
        writer.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request) "
            "VALUES ('late', now(), 'y', 0, 's', '{\"q\": \"an answer\"}')"
        )
        assert secret in postgres.dump(database)
        forget(leader, Forget(trajectory="x"))
        assert secret not in postgres.dump(database)
        try:
            writer.con.execute("COMMIT")
        except duckdb.TransactionException:
            # Refused, beside the forget's deletes (a load is then placed and committed
            # again: `Loader._load_placing`).
            with contextlib.suppress(duckdb.Error):
                writer.con.execute("ROLLBACK")
        assert secret not in postgres.dump(database)
    finally:
        writer.close()
        leader.close()


def test_eight_writer_processes_commit_into_one_lake_at_once(catalog, tmp_path):
    """Eight processes, each a host writing its own batches: every row lands, once."""
    con = duckdb.connect()
    lake.attach(con, catalog, str(tmp_path / "data"))
    lake.migrate(con)
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onjob.testing.lake_writer",
                catalog,
                str(tmp_path / "data"),
                f"host{n}",
                "--batches",
                "5",
                "--batch",
                "40",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(8)
    ]
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    count, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM exchanges").fetchone()
    assert (count, distinct) == (8 * 5 * 40, 8 * 5 * 40)


def test_a_lineages_work_is_one_workers_at_a_time(catalog, tmp_path):
    """Workers' leases (`collector/jobs.py`): of eight workers claiming one lineage at once,
    one holds it and the others are told who; its holder renews it and gives it back, and
    the next takes it at once; a lease not renewed (a dead worker) runs out; eight
    lineages claimed at once by eight workers are each one's own."""
    cons = []
    for i in range(8):
        con = duckdb.connect()
        lake.attach(con, catalog, str(tmp_path / "data"))
        if i == 0:
            lake.migrate(con)
        jobs.make(con)  # made once; each other worker finds it made
        cons.append(con)
    try:
        with ThreadPoolExecutor(8) as pool:
            said = list(pool.map(lambda i: jobs.claim(cons[i], "agent", f"w{i}", 30), range(8)))
        holders = [i for i, held in enumerate(said) if held is None]
        assert len(holders) == 1, said
        w = holders[0]
        assert {held[0] for held in said if held is not None} == {f"w{w}"}
        assert jobs.holders(cons[(w + 1) % 8]) == {"agent": f"w{w}"}
        assert jobs.claim(cons[w], "agent", f"w{w}", 30) is None  # renewed
        other = (w + 1) % 8
        assert jobs.claim(cons[other], "agent", f"w{other}", 30)[0] == f"w{w}"
        jobs.release(cons[w], "agent", f"w{w}")
        assert jobs.claim(cons[other], "agent", f"w{other}", 1) is None  # at once
        time.sleep(1.2)  # the holder stops renewing, as a killed worker would
        assert jobs.holders(cons[w]) == {}
        assert jobs.claim(cons[w], "agent", f"w{w}", 30) is None
        with ThreadPoolExecutor(8) as pool:
            said = list(pool.map(lambda i: jobs.claim(cons[i], f"l{i}", f"w{i}", 30), range(8)))
        assert said == [None] * 8
        assert jobs.holders(cons[0]) == {"agent": f"w{w}"} | {f"l{i}": f"w{i}" for i in range(8)}
    finally:
        for con in cons:
            con.close()


def test_a_worker_whose_hold_another_took_stops_its_job_before_deciding(catalog, tmp_path):
    """A worker's hold (`deploy/act/holds.py`) on a lake: held while its job runs, renewed
    past its lease; when another worker has taken the lineage (the first stalled past its
    lease), the next renewal cancels the job with `LineageLost`, and the job's next step
    never runs. Meanwhile a second worker asking for the lineage is told who holds it."""
    from onjob.collector import Collector
    from onjob.deploy.act.holds import held
    from onjob.deploy.errors import LineageBusy, LineageLost

    settings = CollectorSettings(
        db=tmp_path / "w.duckdb", catalog=catalog, data_path=str(tmp_path / "d"), job_lease_s=1.5
    )
    steps: list[str] = []

    async def main() -> None:
        first, second = Collector(settings), Collector(settings.model_copy(
            update={"db": tmp_path / "v.duckdb"}))  # fmt: skip
        await first.start()
        await second.start()
        try:
            async with held(first, "agent"):
                await asyncio.sleep(2.5)  # past its lease: renewed meanwhile
                steps.append("renewed")
                with pytest.raises(LineageBusy, match="works lineage agent now"):
                    async with held(second, "agent"):
                        pass
            async with held(second, "agent"):  # given back at the job's end: taken at once
                steps.append("given back")
            with pytest.raises(LineageLost, match="thief holds it now"):
                async with held(first, "agent"):
                    await second.query(lambda st: st.con.execute(
                        "UPDATE lake_jobs SET holder = 'thief', "
                        "until = now() + INTERVAL 1 HOUR WHERE name = 'agent'"))  # fmt: skip
                    await asyncio.sleep(5)
                    steps.append("decided")  # never: the job was stopped first
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())
    assert steps == ["renewed", "given back"]


def _onjob(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def test_a_server_logs_into_a_lake_that_readers_attach_beside_it(
    postgres, catalog, tmp_path, fake_engine_url
):
    """`onjob serve` with `collector.catalog`: an unchanged `openai` agent's conversation is
    logged into the lake, stitched into one trajectory; `onjob sql` reads it through the
    server and, with the server stopped, by attaching the lake itself; a restarted server
    continues the same conversation; `onjob forget` through the server leaves its text
    nowhere in the catalog or the data files; the start-up line never shows the catalog's
    password."""
    data = tmp_path / "data"
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__ADMIN_KEY": "adm-lake-5c1e",
        "ONJOB_COLLECTOR__CATALOG": catalog + " password=unused-but-secret",
        "ONJOB_COLLECTOR__DATA_PATH": str(data),
    }
    args = ["--engine-url", fake_engine_url, "--db", str(tmp_path / "onjob.duckdb")]
    question = "Which harbour does the night ferry leave from?"
    messages = [{"role": "user", "content": question}]

    def turn(server: ServerProcess) -> str:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
        reply = client.chat.completions.create(model="agent", messages=messages)
        messages.extend(
            [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "And when?"},
            ]
        )
        return reply.id

    with ServerProcess(args, env=env, log=tmp_path / "server.log") as server:
        turn(server)
        turn(server)
        assert "unused-but-secret" not in server.output()
        assert "logging to the DuckLake of" in server.output()
        given = ("--server", server.base, "--admin-key", env["ONJOB_PROXY__ADMIN_KEY"])
        sql = "SELECT count(*) AS n, count(DISTINCT trajectory_id) AS t FROM exchanges"
        asked = _onjob("sql", sql, "--json", *given, env={})
        assert asked.returncode == 0, asked.stderr
        assert json.loads(asked.stdout)["rows"] == [[2, 1]]
        # Forgetting beside the server is refused: the leading server forgets.
        beside = _onjob("forget", "--trajectory", "t", "--db", "x", env=env)
        assert beside.returncode == 2 and "another onjob leads this DuckLake" in beside.stderr
    with ServerProcess(args, env=env, log=tmp_path / "server2.log") as server:
        turn(server)
    # The server gone, a reader attaches the lake itself (read-only, locked down).
    offline = _onjob("sql", sql, "--json", "--db", str(tmp_path / "onjob.duckdb"), env=env)
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["rows"] == [[3, 1]]
    refused = _onjob("sql", "SELECT * FROM read_text('/etc/passwd')", "--db", "x", env=env)
    assert refused.returncode != 0 and "root:" not in refused.stdout
    reader = duckdb.connect()
    lake.attach(reader, catalog, str(data), read_only=True)
    (trajectory, request) = reader.execute(
        "SELECT trajectory_id, request FROM exchanges_full ORDER BY turn DESC LIMIT 1"
    ).fetchone()
    reader.close()
    assert json.loads(request)["messages"] == messages[:-2]  # the third turn asked, whole
    with ServerProcess(args, env=env, log=tmp_path / "server3.log") as server:
        given = ("--server", server.base, "--admin-key", env["ONJOB_PROXY__ADMIN_KEY"])
        # It leads at once, or, where a busy machine cut the last server's stop short (its
        # lease not given back), once that lease has run out: the leader forgets.
        admin = {"Authorization": f"Bearer {env['ONJOB_PROXY__ADMIN_KEY']}"}
        deadline = time.monotonic() + lake.LEADER_LEASE_S * 4 / 3 + 5
        while (
            "leads the DuckLake"
            not in httpx.get(f"{server.base}/admin/status", headers=admin, timeout=30).json()[
                "collector"
            ]["loader"]
        ):
            assert time.monotonic() < deadline, server.output()[-2000:]
            time.sleep(0.5)
        forgot = _onjob("forget", "--trajectory", trajectory, "--json", *given, env={})
        assert forgot.returncode == 0, forgot.stderr
    database = catalog.split("dbname=")[1]
    assert question not in postgres.dump(database)
    assert _files_holding(data, question.encode()) == []


def test_a_lake_is_named_whole_and_not_beside_the_bucket_hand_off():
    with pytest.raises(ValueError, match="go together"):
        CollectorSettings(catalog="host=127.0.0.1 dbname=lake")
    with pytest.raises(ValueError, match="hand-off of spool"):
        CollectorSettings(catalog="dbname=lake", data_path="/tmp/lake", bucket="s3://b/p")
    assert lake.shown("host=h dbname=d password=hunter2") == "host=h dbname=d password=***"
    assert lake.shown("postgresql://me:hunter2@h/d") == "postgresql://me:***@h/d"


def test_the_loop_runs_every_stage_on_a_lake(
    catalog, tmp_path, tool_engine, tool_model_dir, monkeypatch
):
    """`onjob loop --once` with the log in a lake: the judge's groups, a training run, its
    checkpoint as a candidate and a canary, then the next iteration's paired comparison
    against live on traffic logged since, every row in the lake."""
    from .test_loop import REWARDS, ROME, TRAIN, assert_compared_since, converse

    data = tmp_path / "data"
    monkeypatch.setenv("ONJOB_COLLECTOR__CATALOG", catalog)  # the servers' and the loop's
    monkeypatch.setenv("ONJOB_COLLECTOR__DATA_PATH", str(data))
    db = tmp_path / "onjob.duckdb"
    converse(db, tool_engine.url, 12, "conv", temperature=0)
    assert not db.exists()  # the lake, not the file
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "onjob.toml").write_text(TRAIN.replace("{model}", str(tool_model_dir)))
    cmd = [sys.executable, "-m", "onjob.cli", "loop", "--once", "--engine-url", tool_engine.url]

    def lake_rows(sql: str) -> list[tuple]:
        reader = duckdb.connect()
        try:
            lake.attach(reader, catalog, str(data), read_only=True)
            return reader.execute(sql).fetchall()
        finally:
            reader.close()

    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded as a candidate" in done.stdout and "canary: ckpt-" in done.stdout
    [(name, status)] = lake_rows("SELECT name, status FROM checkpoints")
    assert status == "canary"
    assert lake_rows("SELECT canary FROM deployments") == [(name,)]
    assert lake_rows("SELECT DISTINCT kind FROM groups") == [("turn",)]
    converse(db, tool_engine.url, 6, "after", ROME, extra_headers={"X-Onjob-Arm": "live"})
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"canary {name} against base" in done.stdout
    assert_compared_since(lake_rows, done.stdout)
    httpx.post(f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def test_two_servers_write_one_lake_and_a_conversation_moves_between_them(
    catalog, tmp_path, fake_engine_url
):
    """Two `onjob serve`s on one lake, each with its own spool, as two hosts behind a load
    balancer: an `openai` agent's conversation whose turns alternate between them, sent
    back to back, is one trajectory in order; a Responses chain started on one continues on
    the other; feedback on one names the other's answer; the one that leads says so, the
    other refuses to forget by hand naming it (forgetting is the leader's), takes a
    routing change by hand (any server's), and leads once the first has stopped."""
    hosts = Hosts(tmp_path, catalog, str(tmp_path / "data"), fake_engine_url)
    admin = hosts.admin

    def loader(s: ServerProcess) -> str:
        return hosts.status(s)["collector"]["loader"]

    with hosts.server("a") as a, hosts.server("b") as b:
        clients = [OpenAI(base_url=s.url, api_key="unused", max_retries=0) for s in (a, b)]
        messages = [{"role": "user", "content": "Plan a walk along the old canal."}]
        ids = []
        for k in range(4):  # a, b, a, b: each turn sent the moment the last one answered
            reply = clients[k % 2].chat.completions.create(model="agent", messages=messages)
            ids.append(reply.id)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"And after stop {k + 1}?"},
            ]
        first = clients[1].responses.create(model="agent", input="Name a canal lock.")
        chained = clients[0].responses.create(
            model="agent", input="And the next one?", previous_response_id=first.id
        )
        rated = httpx.post(
            f"{a.url}/feedback", json={"exchange_id": ids[1], "value": 1.0}, timeout=30
        )
        assert rated.status_code == 200, rated.text
        assert "leads the DuckLake" in loader(a)
        assert "writes the DuckLake" in loader(b) and "leads" in loader(b)
        refused = httpx.post(
            f"{b.base}/admin/forget", json={"trajectory": "nothing"}, headers=admin, timeout=30
        )
        assert refused.status_code == 409 and "leads this DuckLake" in refused.text
        taken = httpx.post(
            f"{b.base}/admin/rollback", json={"alias": "agent"}, headers=admin, timeout=30
        )  # taken on b: refused only for want of a canary, not for b's not leading
        assert taken.status_code == 409 and "has no canary to roll back" in taken.text
        given = ("--server", b.base, "--admin-key", hosts.key)
        asked = _onjob(
            "sql",
            "SELECT id, trajectory_id, turn, api FROM exchanges ORDER BY ts",
            "--json",
            *given,
            env={},
        )
        assert asked.returncode == 0, asked.stderr
        rows = json.loads(asked.stdout)["rows"]
        chat = [r for r in rows if r[0] in ids]
        assert [r[0] for r in chat] == ids and [r[2] for r in chat] == [0, 1, 2, 3]
        assert len({r[1] for r in chat}) == 1
        by_id = {r[0]: r for r in rows}
        assert by_id[chained.id][1] == by_id[first.id][1] and by_id[chained.id][2] == 1
        # Each turn, stored against the last one its own server logged, reads back whole.
        rebuilt = _onjob("sql", "SELECT id, request FROM exchanges_full", "--json", *given, env={})
        requests = {r[0]: json.loads(r[1]) for r in json.loads(rebuilt.stdout)["rows"]}
        assert requests[ids[-1]]["messages"] == messages[:-2]
        a.stop()
        # Its next claim: a third of the lease after a stop that gave the lease back, the
        # whole lease more where the stop was cut short (a busy machine's SIGKILL).
        deadline = time.monotonic() + lake.LEADER_LEASE_S * 4 / 3 + 5
        while "leads the DuckLake" not in loader(b):
            assert time.monotonic() < deadline, b.output()[-2000:]
            time.sleep(0.5)
        assert "this server leads now" in b.output()


def test_a_canary_set_on_a_server_that_does_not_lead_reaches_the_leaders_router(
    catalog, tmp_path, engine, tiny_adapter_dir, tiny_model_dir
):
    """Two servers on one lake before one engine, the loop on in both: a canary set by hand
    on the one that does not lead is taken there (a routing change is no longer the
    leader's alone), and reaches the leader's router (each server reads the `deployments`
    rows any worker or person wrote), which then serves the canary's slice of
    conversations too."""
    data = str(tmp_path / "data")
    hosts = Hosts(
        tmp_path, catalog, data, engine.url, ONJOB_LOOP__INTERVAL_S="1", ONJOB_LOOP__TRAIN="false"
    )
    admin = hosts.admin
    first = Store(tmp_path / "r.duckdb", catalog=catalog, data_path=data, follow=True)
    registry.add(first, tiny_adapter_dir, "cand-1", tiny_model_dir)
    first.close()

    def arms(s: ServerProcess) -> list[str]:
        client = OpenAI(base_url=s.url, api_key="unused", max_retries=0)
        return [
            client.chat.completions.with_raw_response.create(
                model="agent", messages=[{"role": "user", "content": f"c{i}"}], max_tokens=2
            ).headers["x-onjob-arm"]
            for i in range(30)
        ]

    with hosts.server("a") as a, hosts.server("b") as b:
        assert set(arms(a)) == {"live"}
        assert "leads the DuckLake" not in hosts.status(b)["collector"]["loader"]
        canary = {"alias": "agent", "checkpoint": "cand-1", "fraction": 0.5}
        set_ = httpx.post(f"{b.base}/admin/canary", json=canary, headers=admin, timeout=60)
        assert set_.status_code == 200, set_.text
        deadline = time.monotonic() + 30
        while True:
            status = hosts.status(a)
            if status["aliases"]["agent"]["canary"] == "cand-1":
                break
            assert time.monotonic() < deadline, a.output()[-2000:]
            time.sleep(0.5)
        assert 3 < arms(a).count("canary") < 27
        # Both loops work (none stands by): each iteration holds the lineage in turn.
        assert status["loop"]["stage"] != "standby" and status["loop"]["iterations"] > 0
        assert hosts.status(b)["loop"]["iterations"] > 0


def test_a_turn_no_server_answered_before_waits_then_starts_its_own_conversation(catalog, tmp_path):
    """A request whose latest assistant message no server gave (a few-shot prompt, an
    edited reply) could be a turn whose previous one another server has not committed: its
    load holds it back for `collector.stitch_wait_s`, the rest of the load going in, then
    places it as a conversation of its own."""
    from onjob.collector import Collector

    from .test_collector import unplaced

    settings = CollectorSettings(
        db=tmp_path / "w.duckdb",
        catalog=catalog,
        data_path=str(tmp_path / "d"),
        stitch_wait_s=2.0,
        flush_interval_s=3600,
    )
    shot = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},  # an example, no server's answer
        {"role": "user", "content": "3+3?"},
    ]
    fresh = [{"role": "user", "content": "hello"}]

    async def main() -> tuple[list, list]:
        c = Collector(settings)
        await c.start()
        c.log(unplaced(shot, 0, status=200))
        c.log(unplaced(fresh, 1, status=200))
        await c.flush()
        first = await c.query(lambda s: s.dicts("SELECT turn FROM exchanges ORDER BY ts"))
        await asyncio.sleep(2.1)
        await c.flush()
        after = await c.query(
            lambda s: s.dicts("SELECT trajectory_id, turn FROM exchanges ORDER BY ts")
        )
        await c.close()
        return first, after

    first, after = asyncio.run(main())
    assert first == [{"turn": 0}]  # the fresh conversation went in; the other waited
    assert [r["turn"] for r in after] == [0, 0]
    assert after[0]["trajectory_id"] != after[1]["trajectory_id"]


def test_a_server_killed_after_answering_loses_nothing_and_writes_nothing_twice(
    catalog, tmp_path, fake_engine_url
):
    """`kill -9` of a lake's server whose answers are still in its spool: restarted on the
    same spool, it writes every one into the lake, and those a load had committed before
    the kill (here: loaded from its spool by hand, the files left as a kill between a
    commit and the files' removal leaves them) are there once."""
    data = str(tmp_path / "data")
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__ADMIN_KEY": "adm-lake-k1ll",
        "ONJOB_COLLECTOR__CATALOG": catalog,
        "ONJOB_COLLECTOR__DATA_PATH": data,
    }
    args = ["--engine-url", fake_engine_url, "--db", str(tmp_path / "k.duckdb")]
    slow = {**env, "ONJOB_COLLECTOR__FLUSH_INTERVAL_S": "3600"}  # nothing loads on its own
    ids = []
    with ServerProcess(args, env=slow, log=tmp_path / "k1.log") as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        for i in range(10):
            ask = [{"role": "user", "content": f"question {i}"}]
            ids.append(client.chat.completions.create(model="agent", messages=ask).id)
        server.kill()
    spool = Spool(tmp_path / "k.duckdb.spool")
    segments = spool.loadable()  # the dead server's, claimed
    spool.close()
    stitcher = Stitcher()

    def place(lines: list) -> list[Placed]:  # as a loader places first turns
        out = []
        for line in lines:
            k = Keys(line.stitch or [], "", "", line.scenario_key, line.scenario_keyed)
            p = stitcher.place_keys(k, api_key_id=line.api_key_id)
            out.append(Placed(line.id, p.trajectory_id, p.turn, p.scenario_id))
        return out

    by_hand = Store(tmp_path / "h.duckdb", catalog=catalog, data_path=data, follow=True)
    assert segments and by_hand.load_segment(segments[0].path, place) > 0
    by_hand.close()
    with ServerProcess(args, env=env, log=tmp_path / "k2.log") as server:
        given = ("--server", server.base, "--admin-key", env["ONJOB_PROXY__ADMIN_KEY"])
        asked = _onjob(
            "sql", "SELECT id FROM exchanges WHERE api IS NULL", "--json", *given, env={}
        )
    assert asked.returncode == 0, asked.stderr
    logged = [r[0] for r in json.loads(asked.stdout)["rows"]]
    assert sorted(logged) == sorted(ids)  # every answer, each once


def test_a_postgres_restart_under_two_servers_loses_no_answer_and_says_so_once(
    tmp_path, fake_engine_url
):
    """The catalog's Postgres stopped while two servers write a lake, then started again:
    every request is answered meanwhile; what must read the lake (a chained call,
    feedback, `/admin/status`) is a 503 with `Retry-After` naming the catalog, without its
    password; each server says once that the catalog does not answer and once that it
    answers again (no traceback per retry); then every answer is in the lake once, and the
    servers' connections take statements again (none left in an aborted transaction)."""
    with Postgres() as pg:
        pg._run(
            "psql", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-c",
            "ALTER USER postgres PASSWORD 's3cret-pw'",
        )  # fmt: skip
        catalog = pg.database("lake_restart").replace(
            "user=postgres", "user=postgres password=s3cret-pw"
        )
        hosts = Hosts(tmp_path, catalog, str(tmp_path / "data"), fake_engine_url)
        admin = hosts.admin

        with hosts.server("a") as a, hosts.server("b") as b:
            clients = [OpenAI(base_url=s.url, api_key="unused", max_retries=0) for s in (a, b)]
            ids: list[str] = []

            def ask(n: int) -> None:
                for _ in range(n):
                    ask = [{"role": "user", "content": f"question {len(ids)}"}]
                    reply = clients[len(ids) % 2].chat.completions.create(
                        model="agent", messages=ask
                    )
                    ids.append(reply.id)

            ask(4)
            first = clients[0].responses.create(model="agent", input="Name a canal lock.")
            pg.stop()
            ask(10)  # answered from the engine, each line in its server's spool
            with pytest.raises(openai.InternalServerError) as chained:
                clients[1].responses.create(
                    model="agent", input="And the next?", previous_response_id=first.id
                )
            assert chained.value.status_code == 503
            rated = httpx.post(
                f"{b.url}/feedback", json={"exchange_id": ids[0], "value": 1.0}, timeout=30
            )
            status = httpx.get(f"{a.base}/admin/status", headers=admin, timeout=30)
            for refused in (rated, status):
                assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
                message = refused.json()["error"]["message"]
                assert "catalog cannot be reached" in message and "s3cret-pw" not in message
            deadline = time.monotonic() + 30
            while True:  # the loaders notice on their next round
                health = httpx.get(f"{a.base}/health", headers=admin, timeout=30).json()
                if health["collector"]["catalog_unreachable_s"] is not None:
                    break
                assert time.monotonic() < deadline, a.output()[-2000:]
                time.sleep(0.5)
            assert "has not answered" in health["collector"]["loader"]
            scraped = httpx.get(f"{a.base}/metrics", headers=admin, timeout=30).text
            gauge = next(
                m for m in text_string_to_metric_families(scraped)
                if m.name == "onjob_catalog_unreachable_seconds"
            )  # fmt: skip
            assert gauge.samples[0].value > 0
            time.sleep(3)  # a few rounds of retries, each of which once logged a traceback
            pg.start()
            ask(2)
            deadline = time.monotonic() + 60
            query = {"query": "SELECT id FROM exchanges WHERE api IS NULL"}
            while True:
                asked = httpx.post(f"{a.base}/admin/sql", json=query, headers=admin, timeout=30)
                if asked.status_code == 200 and len(asked.json()["rows"]) == len(ids):
                    break
                assert time.monotonic() < deadline, (asked.text, a.output()[-3000:])
                time.sleep(0.5)
            assert sorted(r[0] for r in asked.json()["rows"]) == sorted(ids)
            for s in (a, b):
                answered = httpx.get(f"{s.base}/admin/status", headers=admin, timeout=30)
                assert answered.status_code == 200, answered.text
                log_ = s.output()
                assert log_.count("catalog cannot be reached") == 1, log_[-3000:]
                assert log_.count("catalog answers again") == 1
                assert "Traceback" not in log_ and "s3cret-pw" not in log_
            rated = httpx.post(
                f"{b.url}/feedback", json={"exchange_id": ids[0], "value": 1.0}, timeout=30
            )
            assert rated.status_code == 200, rated.text


def test_a_leader_whose_catalog_does_not_answer_stops_leading_before_its_lease_ends(
    tmp_path,
):
    """A leader that cannot renew trusts its lease for less than the lease: by the time the
    catalog's own lease ends (and another may take it), it no longer leads; once the
    catalog answers, its claim is not stuck in the transaction the failed one began."""
    with Postgres() as pg:
        catalog = pg.database("lake_lapse")
        store = Store(
            tmp_path / "l.duckdb", catalog=catalog, data_path=str(tmp_path / "d"), lease_s=2.0
        )
        assert store.leading
        pg.stop()
        with pytest.raises(duckdb.Error) as lost:
            store.keep_lease()
        assert lake.unreachable(lost.value)
        time.sleep(2.0 * store_module.LEASE_TRUSTED)
        assert not store.leading  # before the catalog's lease (2 s after the last claim) ends
        pg.start()
        store.keep_lease()
        assert store.leading
        store.close()


def test_eight_servers_write_one_lake_in_s3_and_a_killed_one_loses_nothing(
    catalog,
    tmp_path,
    fake_engine_url,
    bucket_url,  # noqa: F811  (fixtures)
    s3_endpoint,  # noqa: F811
):
    """Eight `onjob serve`s on one lake whose files are in S3 (moto), as eight hosts behind
    a load balancer, eight `openai` agents at once: each conversation's turns go to a
    different server each, back to back, and each is one trajectory in order; a Responses
    chain continued on another server and feedback sent to a third answer 100%. Then one
    server is killed with SIGKILL while the agents send on (the balancer skipping it), and
    started again on its spool: every answer is in the lake, each once. The leader
    compacts the lake's files meanwhile."""
    hosts = Hosts(
        tmp_path,
        catalog,
        bucket_url + "/lake/",
        fake_engine_url,
        ONJOB_COLLECTOR__COMPACT_S="3",  # the leader merges the loads' small files
        AWS_ENDPOINT_URL=s3_endpoint,
    )
    admin, n = hosts.admin, 8
    servers = [hosts.server(f"h{k}") for k in range(n)]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(n) as pool:
        for s in servers:
            stack.callback(s.stop)
        list(pool.map(lambda s: s.start(), servers))
        clients = [OpenAI(base_url=s.url, api_key="unused", max_retries=0) for s in servers]

        def agent(i: int) -> dict:
            """Three conversations of three turns, a chain, and feedback, over the servers."""
            done: dict = {"conversations": [], "chains": [], "rated": []}
            for c in range(3):
                messages = [{"role": "user", "content": f"Agent {i}, trip {c}: where first?"}]
                ids = []
                for t in range(3):  # each turn to the next server: never the same twice
                    reply = clients[(i + c + t) % n].chat.completions.create(
                        model="agent", messages=messages
                    )
                    ids.append(reply.id)
                    messages += [
                        {"role": "assistant", "content": reply.choices[0].message.content},
                        {"role": "user", "content": f"And after stop {t + 1}?"},
                    ]
                done["conversations"].append(ids)
                rated = httpx.post(
                    f"{servers[(i + c + 4) % n].url}/feedback",
                    json={"exchange_id": ids[0], "value": 1.0},
                    timeout=60,
                )
                done["rated"].append(rated.status_code)
            first = clients[i].responses.create(model="agent", input=f"Agent {i}: a lock?")
            chained = clients[(i + 1) % n].responses.create(
                model="agent", input="And the next one?", previous_response_id=first.id
            )
            done["chains"].append((first.id, chained.id))
            return done

        results = list(pool.map(agent, range(n)))
        assert all(code == 200 for r in results for code in r["rated"])

        def lake_rows(sql: str) -> list:
            asked = httpx.post(
                f"{servers[0].base}/admin/sql",
                json={"query": sql, "limit": 100000},
                headers=admin,
                timeout=60,
            )
            assert asked.status_code == 200, asked.text
            return asked.json()["rows"]

        def wait_for(ids: set[str]) -> dict:
            deadline = time.monotonic() + 90
            while True:
                rows = lake_rows("SELECT id, trajectory_id, turn FROM exchanges")
                if ids <= {r[0] for r in rows}:
                    return {r[0]: r for r in rows}, rows
                assert time.monotonic() < deadline, len(ids - {r[0] for r in rows})
                time.sleep(1)

        chats = [ids for r in results for ids in r["conversations"]]
        chains = [pair for r in results for pair in r["chains"]]
        by_id, _ = wait_for({i for ids in chats for i in ids} | {i for p in chains for i in p})
        for ids in chats:  # every conversation one trajectory, turns 0, 1, 2
            assert [by_id[i][2] for i in ids] == [0, 1, 2]
            assert len({by_id[i][1] for i in ids}) == 1
        for first, chained in chains:
            assert by_id[chained][1] == by_id[first][1] and by_id[chained][2] == 1
        assert lake_rows("SELECT count(*) FROM feedback")[0][0] == n * 3

        # A host dies mid-traffic: what it answered is in its spool; the balancer skips it.
        answered: list[str] = []
        lock = threading.Lock()

        def single(i: int) -> None:
            for k in range(12):
                for step in range(n):  # the next server that answers
                    try:
                        reply = clients[(i + k + step) % n].chat.completions.create(
                            model="agent", messages=[{"role": "user", "content": f"{i}/{k}"}]
                        )
                        break
                    except openai.APIConnectionError:
                        continue
                with lock:
                    answered.append(reply.id)
                if i == 0 and k == 6:
                    servers[5].kill()

        list(pool.map(single, range(n)))
        servers[5] = hosts.server("h5")
        stack.callback(servers[5].stop)
        servers[5].start()  # on the dead one's spool: it writes what it had not
        _, rows = wait_for(set(answered))
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids))  # none twice
        assert len(answered) == n * 12
        assert any("compacted the DuckLake" in s.output() for s in servers)


def test_compaction_merges_a_lakes_small_files_beside_a_writer_and_keeps_every_row(
    catalog, tmp_path
):
    """Each load leaves a data file per table it inserts into; `Store.compact` merges them
    while another writer process commits beside it, and removes the files no kept
    snapshot reads: fewer files, on disk and in the lake's list, every row there once."""
    data = tmp_path / "data"
    store = Store(tmp_path / "c.duckdb", catalog=catalog, data_path=str(data))
    try:
        for n in range(30):  # thirty commits, as thirty loads of one server
            store.con.execute(
                "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, request) "
                "SELECT 'c' || ? || '-' || i, now(), 't', 0, 's', '{}' FROM range(100) r(i)",
                [n],
            )

        def files() -> tuple[int, int]:
            listed = store.con.execute(
                f"SELECT count(*) FROM ducklake_list_files('{lake.NAME}', 'exchanges')"
            ).fetchone()[0]
            return listed, sum(1 for _ in (data / "main" / "exchanges").glob("*.parquet"))

        assert files() == (30, 30)
        beside = subprocess.Popen(
            [sys.executable, "-m", "onjob.testing.lake_writer", catalog, str(data), "w",
             "--batches", "20", "--batch", "50"],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        merged = store.compact(keep_s=0)
        _, err = beside.communicate(timeout=300)
        assert beside.returncode == 0, err
        assert merged >= 30
        listed, on_disk = files()
        assert listed <= 21 and on_disk <= listed + 20  # the writer's own files may follow
        count, distinct = store.con.execute(
            "SELECT count(*), count(DISTINCT id) FROM exchanges"
        ).fetchone()
        assert count == distinct == 30 * 100 + 20 * 50
    finally:
        store.close()


def test_eight_processes_making_one_new_lake_at_once_all_attach_it(catalog, tmp_path):
    """Eight servers rolled out together on an empty catalog each create DuckLake's tables
    and then onjob's schema in it at once: each loser finds them made and attaches (before,
    seven of eight exited with "already exists")."""
    make = (
        "import sys, duckdb; from onjob.collector import lake; con = duckdb.connect(); "
        "lake.attach(con, sys.argv[1], sys.argv[2]); print(lake.migrate(con))"
    )
    makers = [
        subprocess.Popen(
            [sys.executable, "-c", make, catalog, str(tmp_path / "d")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    made = [m.communicate(timeout=120) for m in makers]
    assert [m.returncode for m in makers] == [0] * 8, [err for _, err in made]
    # One made the schema (it found version 0), the others found it made.
    assert sorted(int(out) for out, _ in made).count(0) == 1


def _lake_rows(catalog: str, data: str):
    def rows(sql: str) -> list[tuple]:
        reader = duckdb.connect()
        try:
            lake.attach(reader, catalog, data, read_only=True)
            return reader.execute(sql).fetchall()
        finally:
            reader.close()

    return rows


def test_a_worker_killed_mid_training_leaves_its_lineage_to_another_server(
    catalog, tmp_path, tool_engine, tool_model_dir, monkeypatch
):
    """Two servers on one lake, the loop on in both: the first judges the logged traffic
    and starts a training run, holding the lineage, which the second passes by; the first
    is killed (SIGKILL, its trainer with it) mid-run. Once its lease has run out
    (`collector.job_lease_s`, 10 s here) the second takes the lineage and trains on the
    groups the first judged (and any it judged since): its checkpoint becomes the
    candidate, no prompt has two groups and no member two scores from one source."""
    from .test_loop import REWARDS, TRAIN, converse

    data = str(tmp_path / "data")
    monkeypatch.setenv("ONJOB_COLLECTOR__CATALOG", catalog)
    monkeypatch.setenv("ONJOB_COLLECTOR__DATA_PATH", data)
    converse(tmp_path / "log.duckdb", tool_engine.url, 8, "conv", temperature=0)
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    config = tmp_path / "onjob.toml"
    config.write_text(TRAIN.replace("{model}", str(tool_model_dir)))
    lease_s = 10
    hosts = Hosts(
        tmp_path,
        catalog,
        data,
        tool_engine.url,
        "--config",
        str(config),
        ONJOB_LOOP__INTERVAL_S="1",
        ONJOB_TRAINER__CHECKPOINTS_DIR=str(tmp_path / "checkpoints"),
        ONJOB_COLLECTOR__JOB_LEASE_S=str(lease_s),
    )
    status, lake_rows = hosts.status, _lake_rows(catalog, data)
    # The first server's run would take minutes: it is killed long before it ends.
    with hosts.server("a", ONJOB_TRAINER__EPOCHS="5000") as a:
        deadline = time.monotonic() + 180
        while status(a)["loop"]["stage"] != "train":
            assert time.monotonic() < deadline, a.output()[-3000:]
            time.sleep(0.5)
        judged = lake_rows("SELECT count(*) FROM groups")[0][0]
        assert judged > 0
        with hosts.server("b") as b:
            while not (status(b)["loop"]["lineages"].get("agent") or {}).get("worker"):
                assert time.monotonic() < deadline, b.output()[-3000:]
                time.sleep(0.5)
            worker = status(b)["loop"]["lineages"]["agent"]["worker"]
            assert "works this lineage now; this worker passes it by" in b.output()
            shown = _onjob("status", "--server", b.base, env={"ONJOB_PROXY__ADMIN_KEY": hosts.key})
            assert f"worked by: {worker}" in shown.stdout, shown.stdout + shown.stderr
            assert status(b)["loop"]["stage"] != "train"
            a.kill()
            killed = time.monotonic()
            while status(b)["loop"]["stage"] != "train":
                assert time.monotonic() - killed < lease_s + 30, b.output()[-3000:]
                time.sleep(0.5)
            took_over_s = time.monotonic() - killed
            while not lake_rows("SELECT name FROM checkpoints"):
                assert time.monotonic() - killed < 300, b.output()[-3000:]
                time.sleep(1)
            [(name, status_)] = lake_rows("SELECT name, status FROM checkpoints")
            assert status_ in ("candidate", "canary"), status_
            assert lake_rows("SELECT count(*) FROM train_runs")[0][0] == 1
            twice = lake_rows(
                "SELECT prefix_exchange FROM groups WHERE kind = 'turn' "
                "GROUP BY prefix_exchange HAVING count(*) > 1"
            )
            scored_twice = lake_rows(
                "SELECT member_id, source FROM scores GROUP BY ALL HAVING count(*) > 1"
            )
            assert twice == [] and scored_twice == [], (twice, scored_twice)
            assert took_over_s > lease_s / 2, took_over_s
            assert worker.split(":")[1] == str(a.proc.pid)  # the killed server was named
    httpx.post(f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


TENANTS = """
[proxy]
api_keys = { "acme" = "sk-acme-5c1f", "beta" = "sk-beta-0e9a" }
tenants = { acme = ["acme"], beta = ["beta"] }
"""


def test_two_workers_share_a_lakes_lineages_each_judged_and_trained_once(
    catalog, tmp_path, tool_engine, tool_model_dir, monkeypatch
):
    """Two `onjob loop --once` at once on one lake, two tenants' traffic in it: the
    workers hold the lineages in turn (one held by the other is passed by; an iteration
    trains one run), so each trains one: one run per lineage, every turn grouped once and
    every member scored once."""
    from .test_loop import REWARDS, TOOL_QUESTION, TOOLS, TRAIN

    data = str(tmp_path / "data")
    monkeypatch.setenv("ONJOB_COLLECTOR__CATALOG", catalog)
    monkeypatch.setenv("ONJOB_COLLECTOR__DATA_PATH", data)
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    config = TENANTS + TRAIN.replace("{model}", str(tool_model_dir)) + "holdout_share = 0\n"
    (tmp_path / "onjob.toml").write_text(config)
    args = ["--engine-url", tool_engine.url, "--db", str(tmp_path / "log.duckdb")]
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess([*args, "--config", str(tmp_path / "onjob.toml")], env=env) as server:
        for key in ("sk-acme-5c1f", "sk-beta-0e9a"):
            client = OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=120)
            for i in range(3):
                client.chat.completions.create(
                    model="agent",
                    messages=TOOL_QUESTION,
                    tools=TOOLS,
                    max_tokens=24,
                    temperature=0,
                    metadata={"trajectory_id": f"{key}-{i}"},
                )
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "onjob.cli", "loop", "--once", "--engine-url", tool_engine.url],
            cwd=tmp_path,
            env={**os.environ, "ONJOB_COLLECTOR__DB": str(tmp_path / f"w{i}.duckdb")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    said = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], said
    lake_rows = _lake_rows(catalog, data)
    runs = lake_rows("SELECT json_extract_string(config, '$.lineage') FROM train_runs ORDER BY 1")
    assert runs == [("agent@acme",), ("agent@beta",)], said
    assert all("recorded as a candidate" in out for out in said), said  # one run each
    assert (
        lake_rows(
            "SELECT prefix_exchange FROM groups WHERE kind = 'turn' "
            "GROUP BY prefix_exchange HAVING count(*) > 1"
        )
        == []
    )
    assert (
        lake_rows(
            "SELECT member_id, source FROM scores GROUP BY member_id, source HAVING count(*) > 1"
        )
        == []
    )
    names = [n for (n,) in lake_rows("SELECT name FROM checkpoints")]
    for name in names:
        httpx.post(f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)
