"""`onjob sql` and `onjob export` while `onjob serve` holds the database (through the admin
API), and on a database no server holds (read-only). Only a single read-only query of the
database's own tables is answered; DuckDB's parser, its bound plan and a read-only
transaction decide, and no query reads a file of the host (`collector/sqlguard.py`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import httpx
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.collector import Store, readonly, sqlguard

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


def admin_sql(served, query: str) -> httpx.Response:
    """`/admin/sql` of the running server, as `onjob sql` sends it."""
    server, _ = served
    return httpx.post(
        f"{server.base}/admin/sql",
        json={"query": query},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )


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
        (
            'SELECT * FROM (WITH "/etc/passwd" AS (SELECT 1) SELECT * FROM "/etc/passwd") t, '
            "'/etc/passwd'",
            "no table '/etc/passwd'",
        ),
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


ROOT = Path(__file__).resolve().parents[1]


def documented_queries() -> list[str]:
    """Every query the README and docs/ give for `onjob sql`: its quoted argument, and
    each ```sql block but those that read the Parquet export with other tools."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        found += re.findall(r'onjob sql "([^"]+)"', text)
        found += [q for q in re.findall(r"```sql\n(.*?)```", text, re.S) if "parquet" not in q]
    return [q for q in found if q != "SELECT ..."]


@pytest.mark.parametrize("name", ["onjob.duckdb", "o.duckdb", "my-db.duckdb", "select.duckdb"])
def test_every_table_view_and_documented_query_is_answered_whatever_the_file_is_called(
    tmp_path, name
):
    """A plan names a table as DuckDB writes SQL (`o.main."groups"`, `"my-db".main.x`): the
    allow-list once compared it unquoted, and `groups` was refused in every database."""
    db = tmp_path / name
    Store(db).close()
    con = readonly.connect(db)
    try:
        relations = [
            r
            for (r,) in con.execute(
                "SELECT table_name FROM duckdb_tables() UNION ALL "
                "SELECT view_name FROM duckdb_views() WHERE NOT internal"
            ).fetchall()
        ]
        assert {"exchanges", "groups", "members", "scores", "exchanges_full"} <= set(relations)
        queries = [f'SELECT count(*) FROM "{r}"' for r in relations] + documented_queries()
        assert len(queries) > len(relations) >= 10
        for query in queries:
            readonly.query(con, query)  # QueryRefused fails the test, naming the query
    finally:
        con.close()
    done = onjob("sql", "SELECT count(*) FROM groups", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == [[0]]


def test_the_readmes_first_query_tells_the_agents_rows_from_the_loops(tmp_path):
    """A newcomer's first query listed the judge's re-samples among their own requests, with
    nothing to tell them apart: it shows each row's `source`."""
    first = re.search(r'onjob sql "([^"]+)"', (ROOT / "README.md").read_text()).group(1)
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    for i, source in enumerate(["production", "resample"]):
        store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, status, latency_ms,"
            " source) VALUES (?, now() + to_seconds(?), 't', 0, 's', 200, 5.0, ?)",
            [f"chatcmpl-{i}", i, source],
        )
    store.close()
    con = readonly.connect(db)
    try:
        answer = readonly.query(con, first, 100)
    finally:
        con.close()
    shown = [dict(zip(answer.columns, row, strict=True)) for row in answer.rows]
    assert [r["source"] for r in shown] == ["production", "resample"]


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


def test_a_misspelt_column_is_said_of_the_query_as_written():
    """The caret quoted the plan's `EXPLAIN (FORMAT json) ...`, which nobody typed."""
    con = duckdb.connect()
    con.execute("CREATE TABLE exchanges (ts INTEGER, source VARCHAR)")
    with pytest.raises(readonly.QueryRefused) as refused:
        readonly.query(con, "SELECT ts, sourc FROM exchanges")
    said = str(refused.value)
    assert 'Candidate bindings: "source"' in said and "EXPLAIN" not in said
    quote, caret = said.split("\n")[-2:]
    assert quote == "LINE 1: SELECT ts, sourc FROM exchanges"
    assert caret.index("^") == quote.index("sourc")


# -- no file of the host, however a query names it ------------------------------------

SECRET = "canary-5e81d0c7"  # in the host's files below: no answer may carry it


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Path:
    """Files the server's process may read: a CSV whose header and row are the secret, a
    JSON document, a text file, a Parquet file and a DuckDB database."""
    d = tmp_path_factory.mktemp("host")
    (d / "secret.csv").write_text(f"{SECRET}_col,n\n{SECRET},2\n")
    (d / "secret.json").write_text(json.dumps({SECRET: SECRET}) + "\n")
    (d / "secret.txt").write_text(SECRET)
    con = duckdb.connect(str(d / "secret.duckdb"))
    con.execute(f"CREATE TABLE t AS SELECT '{SECRET}' AS s")
    con.execute(f"COPY t TO '{d}/secret.parquet' (FORMAT parquet)")
    con.close()
    return d


F = "{d}/secret.csv"
# Each way a query might name a file, a URL or a statement that is not one SELECT, with
# what the refusal says. `{d}`: the host's folder above; `{spool}`: the server's own spool.
BYPASSES = [
    # A CTE's name counts only where it is in scope.
    (f'SELECT * FROM (WITH "{F}" AS (SELECT 1) SELECT * FROM "{F}") t, \'{F}\'', "no table"),
    (f'WITH a AS (WITH "{F}" AS (SELECT 1) SELECT 1) SELECT * FROM a, "{F}"', "no table"),
    (f'SELECT (WITH "{F}" AS (SELECT 1) SELECT 1) AS x, * FROM "{F}"', "no table"),
    (f'WITH a AS (SELECT * FROM "{F}"), "{F}" AS (SELECT 1) SELECT * FROM a', "no table"),
    (f'WITH "{F}" AS (SELECT * FROM "{F}") SELECT * FROM "{F}"', "no table"),
    (
        f'WITH RECURSIVE "{F}"(x) AS (SELECT n FROM "{F}" UNION ALL SELECT x FROM "{F}" '
        f'WHERE false) SELECT * FROM "{F}"',
        "no table",
    ),
    # Table functions that read files, run SQL or show the configuration.
    (f"SELECT * FROM read_csv('{F}')", "read_csv()"),
    (f"SELECT * FROM read_csv_auto('{F}')", "read_csv_auto()"),
    ("SELECT * FROM read_text('{d}/secret.txt')", "read_text()"),
    ("SELECT * FROM read_blob('{d}/secret.txt')", "read_blob()"),
    ("SELECT * FROM read_json('{d}/secret.json')", "read_json()"),
    ("SELECT * FROM read_json_objects('{d}/secret.json')", "read_json_objects()"),
    ("SELECT * FROM read_parquet('{d}/secret.parquet')", "read_parquet()"),
    ("SELECT * FROM parquet_scan('{d}/secret.parquet')", "parquet_scan()"),
    ("SELECT * FROM parquet_metadata('{d}/secret.parquet')", "parquet_metadata()"),
    (f"SELECT * FROM sniff_csv('{F}')", "sniff_csv()"),
    ("SELECT * FROM glob('{d}/*')", "glob()"),
    (f"SELECT * FROM query('SELECT * FROM ''{F}''')", "query()"),
    ("SELECT * FROM query_table('exchanges')", "query_table()"),
    ("SELECT * FROM duckdb_settings()", "duckdb_settings()"),
    ("SELECT * FROM duckdb_secrets()", "duckdb_secrets()"),
    ("SELECT * FROM duckdb_extensions()", "duckdb_extensions()"),
    ("SELECT * FROM pg_catalog.pg_settings", "duckdb_settings()"),  # a view over it
    # Paths and globs as table names, however quoted or wrapped.
    (f"SELECT * FROM '{F}'", "no table"),
    (f'SELECT * FROM "{F}"', "no table"),
    (f'SELECT * FROM main."{F}"', "no table"),
    (f'SELECT * FROM pg_catalog."{F}"', "no table"),
    ("FROM '{d}/*.csv'", "no table"),
    ("SELECT * FROM '{d}/secret.parquet'", "no table"),
    ("SELECT * FROM '{spool}/*.jsonl'", "no table"),
    ("SELECT * FROM read_json('{spool}/*')", "read_json()"),
    (f"SELECT (SELECT max(n) FROM '{F}') AS x", "no table"),
    (f"SELECT count(*) FROM exchanges WHERE id IN (FROM '{F}' SELECT {SECRET}_col)", "no table"),
    (f"SELECT * FROM exchanges, LATERAL (SELECT * FROM '{F}')", "no table"),
    (f"SELECT * FROM exchanges_rebuilt((SELECT list(n::VARCHAR) FROM '{F}'), false)", "no table"),
    (f"DESCRIBE '{F}'", "no table"),
    (f"SUMMARIZE '{F}'", "no table"),
    (f'SHOW "{F}"', "no table"),
    (f"SELECT * FROM (DESCRIBE '{F}')", "no table"),
    (f"SELECT * FROM (UNPIVOT '{F}' ON n INTO NAME k VALUE v)", "no table"),
    ('SELECT * FROM "feedbac\u212a"', "no table"),  # a Kelvin sign: `feedback` to Python
    ("SELECT * FROM memory.main.exchanges", "no table"),
    # URLs (refused before DuckDB binds them: nothing is sent).
    ("SELECT * FROM 'http://127.0.0.1:9/x.csv'", "no table"),
    ("SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "read_csv()"),
    ("SELECT * FROM read_parquet('s3://onjob-test/x.parquet')", "read_parquet()"),
    # Statements other than one SELECT.
    ("ATTACH '{d}/secret.duckdb' AS s", "only a SELECT"),
    ("COPY exchanges TO '{d}/stolen.csv'", "only a SELECT"),
    ("COPY (SELECT 1) TO '{d}/stolen.csv'", "only a SELECT"),
    ("EXPORT DATABASE '{d}/dump'", "only a SELECT"),
    # DuckDB 1.5 parses this one as a SELECT of `pragma_version()`, refused by its plan.
    ("PRAGMA version", ("only a SELECT", "pragma_version()")),
    ("SET enable_external_access = true", "only a SELECT"),
    ("RESET lock_configuration", "only a SELECT"),
    ("INSTALL httpfs", "only a SELECT"),
    ("LOAD httpfs", "only a SELECT"),
    ("CALL pragma_version()", "only a SELECT"),
    ("USE memory", "only a SELECT"),
    ("DETACH onjob", "only a SELECT"),
    ("CHECKPOINT", "only a SELECT"),
    (f"EXPLAIN ANALYZE SELECT * FROM '{F}'", "only a SELECT"),
    # DuckDB 2.0 makes it one statement (MULTI), 1.5 two.
    ("PIVOT exchanges ON status USING count(*)", ("only a SELECT", "exactly one statement")),
    (f"SELECT 1; SELECT * FROM '{F}'", "exactly one statement"),
    ("SELECT 1 /* ; */; DELETE FROM exchanges", "exactly one statement"),
    ("SELECT 1 -- a comment\n; DROP TABLE exchanges", "exactly one statement"),
    # Deeper than the checks can walk: refused, not a server error.
    ("SELECT " + " + ".join(["1"] * 900), "nests too deeply"),
    ("SELECT * FROM " + "(SELECT * FROM " * 300 + "range(1)" + ") t" * 300, "nests too deeply"),
]


@pytest.mark.parametrize(("query", "said"), BYPASSES)
def test_no_query_reads_a_file_of_the_host(served, host, query, said):
    _, db = served
    query = query.replace("{d}", str(host)).replace("{spool}", f"{db}.spool")
    resp = admin_sql(served, query)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    reasons = said if isinstance(said, tuple) else (said,)
    assert error["type"] == "invalid_request_error", error
    assert any(reason in error["message"] for reason in reasons), error
    assert SECRET not in resp.text
    assert not (host / "stolen.csv").exists() and not (host / "dump").exists()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # Joins, aggregates, window functions, CTEs (nested, recursive), the schema's view
        # and macro, the catalogue.
        (
            "SELECT count(*) = count(t.id) FROM exchanges e "
            "JOIN trajectories t ON e.trajectory_id = t.id WHERE e.status < 400",
            [[True]],
        ),
        (
            "WITH keys AS (SELECT api_key_id, count(*) AS n FROM exchanges GROUP BY ALL), "
            "top AS (SELECT * FROM keys ORDER BY n DESC LIMIT 1) SELECT count(*) FROM top",
            [[1]],
        ),
        (
            "SELECT max(k) FROM (SELECT row_number() OVER (PARTITION BY api_key_id "
            "ORDER BY ts) AS k FROM exchanges)",
            [[6]],
        ),
        (
            "WITH x AS (SELECT 2 AS v) SELECT * FROM (WITH y AS (SELECT v * 3 AS w FROM x) "
            "SELECT w FROM y)",
            [[6]],
        ),
        (
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 4) "
            "SELECT sum(i) FROM r",
            [[10]],
        ),
        ("SELECT count(*) FROM exchanges_full", [[6]]),
        (
            "SELECT count(*) FROM exchanges_rebuilt((SELECT list(id) FROM exchanges), false)",
            [[6]],
        ),
        (
            "SELECT count(*) > 0 FROM information_schema.columns "
            "WHERE table_name = 'exchanges' AND column_name = 'trajectory_id'",
            [[True]],
        ),
        ("SELECT count(*) > 0 FROM pg_catalog.pg_class WHERE relname = 'exchanges'", [[True]]),
        ("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'feedback'", [[1]]),
        ("SELECT * FROM range(3) UNION ALL SELECT unnest([7])", [[0], [1], [2], [7]]),
    ],
)
def test_ordinary_queries_of_the_database_are_answered(served, query, expected):
    resp = admin_sql(served, query)  # the admin API loads the spool first: all six are in
    assert resp.status_code == 200, resp.text
    assert sorted(resp.json()["rows"]) == expected


def test_no_query_installs_or_loads_an_extension_on_demand(served):
    """A type or function of an extension DuckDB would fetch and load for a query (`::INET`)
    cannot make it: both switches are off in the server's DuckDB once it answers SQL. (The
    query that would fetch one is not sent: it would try the network.)"""
    admin_sql(served, "SELECT 1")
    resp = admin_sql(
        served,
        "SELECT current_setting('autoinstall_known_extensions') AS install, "
        "current_setting('autoload_known_extensions') AS load",
    )
    assert resp.status_code == 200 and resp.json()["rows"] == [[False, False]], resp.text


def test_show_describe_and_summarize_read_the_database_own_tables(served):
    shown = admin_sql(served, "SHOW TABLES").json()
    assert {"exchanges", "feedback", "exchanges_full"} <= {r[0] for r in shown["rows"]}
    described = admin_sql(served, "DESCRIBE exchanges").json()
    assert "trajectory_id" in {r[0] for r in described["rows"]}
    assert admin_sql(served, "SHOW exchanges").status_code == 200
    summary = admin_sql(served, "SUMMARIZE SELECT status FROM exchanges").json()
    assert summary["rows"][0][0] == "status"


def test_the_plan_check_alone_refuses_what_reads_files(tmp_path):
    """The second line: what the tree check would let through by mistake (given here
    straight to the plan check) is refused for what DuckDB bound it to."""
    (tmp_path / "x.csv").write_text(f"{SECRET}\n1\n")
    x = f"{tmp_path}/x.csv"
    store = Store(tmp_path / "onjob.duckdb")
    con = store.cursor()
    refused = {
        f"SELECT * FROM '{x}'": "read_csv_auto()",
        f"SELECT * FROM read_text('{x}')": "read_text()",
        f"SELECT * FROM glob('{tmp_path}/*')": "glob()",
        "SELECT * FROM duckdb_settings()": "duckdb_settings()",
        f"SELECT * FROM (WITH \"{x}\" AS (SELECT 1) SELECT 1) t, '{x}'": "read_csv_auto()",
    }
    try:
        own = sqlguard.Own.of(con)
        for sql, said in refused.items():
            [statement] = con.extract_statements(sql)
            with pytest.raises(readonly.QueryRefused, match=re.escape(said)):
                sqlguard.check_plan(con, statement, own)
        for sql in ("SELECT * FROM exchanges_full", "SELECT * FROM information_schema.tables"):
            [statement] = con.extract_statements(sql)
            sqlguard.check_plan(con, statement, own)
    finally:
        con.close()
        store.close()


def test_a_database_no_server_holds_is_opened_with_duckdbs_own_locks(tmp_path, host):
    """`onjob sql --db`: DuckDB itself refuses files, extensions and SET there, whatever
    the checks let through."""
    db = tmp_path / "onjob.duckdb"
    Store(db).close()
    con = readonly.connect(db)
    try:
        with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
            con.execute(f"SELECT * FROM read_csv('{host}/secret.csv')").fetchall()
        for setting in ("enable_external_access = true", "autoload_known_extensions = true"):
            with pytest.raises(duckdb.InvalidInputException, match="configuration"):
                con.execute(f"SET {setting}")
        assert readonly.query(con, "SELECT count(*) FROM exchanges_full").rows == [[0]]
    finally:
        con.close()
    x = f"{host}/secret.csv"
    done = onjob(
        "sql", f"SELECT * FROM (WITH \"{x}\" AS (SELECT 1) SELECT 1) t, '{x}'", "--db", str(db)
    )
    assert done.returncode == 2 and "no table" in done.stderr
    assert SECRET not in done.stdout + done.stderr
