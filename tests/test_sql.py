"""`onjob sql` and `onjob export` while `onjob serve` holds the database (through the admin
API), and on a database no server holds (read-only). Only a single read-only query of the
database's own tables is answered; DuckDB's parser and a read-only transaction decide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.collector import readonly

ADMIN = "adm-1f0c7e93b5"
KEYS = {"alice": "sk-alice-62d0a9b1"}


def onjob(*args: str, admin: str | None = ADMIN) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("ONJOB_PROXY__ADMIN_KEY", None)
    if admin:
        env["ONJOB_PROXY__ADMIN_KEY"] = admin
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", *args], capture_output=True, text=True, env=env
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory, fake_engine_url):
    """A running server with six answered exchanges, and its database's path."""
    tmp = tmp_path_factory.mktemp("sql")
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__API_KEYS": json.dumps(KEYS),
        "ONJOB_PROXY__ADMIN_KEY": ADMIN,
        "ONJOB_COLLECTOR__QUERY_TIMEOUT_S": "1",
    }
    db = tmp / "onjob.duckdb"
    args = ["--engine-url", fake_engine_url, "--db", str(db)]
    with ServerProcess(args, env=env, log=tmp / "server.log") as server:
        client = OpenAI(base_url=server.url, api_key=KEYS["alice"], max_retries=0, timeout=30)
        for i in range(6):
            client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": f"q{i}"}]
            )
        yield server, db


def ask(served, *args: str, admin: str | None = ADMIN) -> subprocess.CompletedProcess:
    server, _ = served
    return onjob(*args, "--server", server.base, admin=admin)


def test_sql_answers_a_select_while_the_server_holds_the_database(served):
    # The spool may not be loaded yet when asked: the answer grows to six.
    done = ask(
        served, "sql", "SELECT count(*) AS n, min(api_key_id) AS key FROM exchanges", "--json"
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["columns"] == ["n", "key"] and answer["types"][0] == "BIGINT"
    shown = ask(served, "sql", "SELECT turn, status FROM exchanges ORDER BY ts")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].split() == ["turn", "status"]
    assert shown.stdout.rstrip().endswith("rows)")
    limited = ask(served, "sql", "SELECT * FROM range(50)", "--limit", "7", "--json")
    assert len(json.loads(limited.stdout)["rows"]) == 7
    assert "only the first 7 rows" in limited.stderr


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("DELETE FROM exchanges", "only a SELECT"),
        ("DROP TABLE exchanges", "only a SELECT"),
        ("SELECT 1; DELETE FROM exchanges", "exactly one statement"),
        ("COPY exchanges TO '/tmp/stolen.csv'", "only a SELECT"),
        ("ATTACH '/tmp/other.duckdb'", "only a SELECT"),
        ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
        ("SELECT * FROM '/etc/passwd'", "no table '/etc/passwd'"),
        ("SELEC id FROM exchanges", "Parser Error"),
        ("SELECT nonesuch FROM exchanges", "Binder Error"),
        ("SELECT * FROM nonesuch", "no table 'nonesuch'"),
    ],
)
def test_sql_refuses_anything_but_one_read_only_query(served, query, said):
    done = ask(served, "sql", query)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    still = ask(served, "sql", "SELECT count(*) FROM exchanges", "--json")
    assert json.loads(still.stdout)["rows"][0][0] > 0  # nothing was deleted


def test_sql_needs_the_admin_key(served):
    for key in (None, "adm-wrong"):
        done = ask(served, "sql", "SELECT 1", admin=key)
        assert done.returncode == 2 and "Admin routes need" in done.stderr


def test_a_query_past_the_time_limit_is_interrupted_and_the_server_goes_on(served):
    done = ask(served, "sql", "SELECT count(*) FROM range(1000000000000) a")
    assert done.returncode == 2 and "interrupted" in done.stderr
    assert ask(served, "sql", "SELECT 1 AS one").returncode == 0


def test_export_writes_every_table_to_parquet_through_the_server(served, tmp_path):
    done = ask(served, "export", "--parquet", str(tmp_path / "dump"))
    assert done.returncode == 0, done.stderr
    files = {p.stem for p in (tmp_path / "dump").glob("*.parquet")}
    assert {"exchanges", "trajectories", "scenarios", "feedback", "forgotten"} <= files
    assert not list((tmp_path / "dump").glob("*.partial"))
    n = duckdb.sql(f"SELECT count(*) FROM '{tmp_path}/dump/exchanges.parquet'").fetchall()[0][0]
    assert 0 < n <= 6
    one = ask(served, "export", "--parquet", str(tmp_path / "one"), "--table", "exchanges")
    assert one.returncode == 0 and [p.name for p in (tmp_path / "one").iterdir()] == [
        "exchanges.parquet"
    ]
    missing = ask(served, "export", "--parquet", str(tmp_path / "x"), "--table", "nonesuch")
    assert missing.returncode == 2 and "no table 'nonesuch'" in missing.stderr


def test_with_the_server_holding_the_file_db_says_to_ask_it(served):
    _, db = served
    done = onjob("sql", "SELECT 1", "--db", str(db))
    assert done.returncode == 2 and "leave out --db" in done.stderr


def test_sql_and_export_open_a_database_no_server_holds_read_only(tmp_path, fake_engine_url):
    db = tmp_path / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", fake_engine_url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
        client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}])
    before = db.stat().st_mtime_ns
    done = onjob("sql", "SELECT count(*) AS n FROM exchanges", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == [[1]]
    refused = onjob("sql", "DELETE FROM exchanges", "--db", str(db))
    assert refused.returncode == 2 and "only a SELECT" in refused.stderr
    dumped = onjob("export", "--parquet", str(tmp_path / "dump"), "--db", str(db))
    assert dumped.returncode == 0, dumped.stderr
    assert "exchanges.parquet (1 rows)" in dumped.stdout
    assert db.stat().st_mtime_ns == before  # opened read-only: the file was not written


def test_help_explains_each_verb():
    for verb, words in (
        ("sql", ["read-only", "--limit", "examples"]),
        ("export", ["--parquet", "--table", "examples"]),
        ("forget", ["--trajectory", "--api-key", "--before", "Checkpoints"]),
    ):
        shown = onjob(verb, "--help")
        assert shown.returncode == 0 and all(w in shown.stdout for w in words), verb


def test_the_checks_are_duckdbs_own(tmp_path: Path):
    con = duckdb.connect()
    con.execute("CREATE TABLE t (a INTEGER); INSERT INTO t VALUES (1), (2)")
    assert readonly.query(con, "WITH x AS (SELECT a FROM t) SELECT sum(a) FROM x").rows == [[3]]
    assert readonly.query(con, "SELECT table_name FROM information_schema.tables").rows
    # A write disguised in a SELECT still runs in a read-only transaction.
    con.execute("CREATE SEQUENCE s")
    with pytest.raises(readonly.QueryRefused, match="read-only"):
        readonly.query(con, "SELECT nextval('s')")
    assert con.execute("SELECT count(*) FROM t").fetchone() == (2,)
