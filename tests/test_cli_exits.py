"""Every command leaves by the one exit-code table (`onjob/cli/exits.py`, docs/cli.md):
real `onjob` processes, a real loopback server for the admin API's refusal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from onjob.cli.exits import Exit, table
from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Store

from .conftest import admin_of

ROOT = Path(__file__).resolve().parents[1]


def onjob(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onjob.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.fixture
def refusing_server():
    """An admin API that refuses every call with OpenAI's error shape."""

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"error": {"message": "no such admin key", "type": "auth"}})
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_table_is_in_the_help_and_in_the_docs():
    done = onjob("--help")
    assert done.returncode == Exit.OK
    assert table() in done.stdout
    assert table() in (ROOT / "docs" / "cli.md").read_text()


def test_refusals_exit_2_and_say_why_once(tmp_path, refusing_server):
    missing = onjob("sql", "SELECT 1", "--db", str(tmp_path / "none.duckdb"))
    assert missing.returncode == Exit.REFUSED == 2
    assert missing.stderr == (
        f"onjob sql: no database at {tmp_path / 'none.duckdb'}: name yours with --db PATH, "
        "or ask the running server with --server URL\n"
    )

    bad_config = onjob("status", "--config", str(tmp_path / "none.toml"))
    assert bad_config.returncode == 2 and bad_config.stderr.startswith("onjob status: ")

    refused = onjob("status", "--server", refusing_server, "--db", str(tmp_path / "x.duckdb"))
    assert refused.returncode == 2
    assert refused.stderr.endswith(
        f"onjob status: {refusing_server}: no such admin key (no admin key was found here: "
        "give --admin-key KEY, or set ONJOB_PROXY__ADMIN_KEY)\n"
    )
    sql = onjob("sql", "SELECT 1", "--server", refusing_server)
    assert sql.returncode == 2 and f"{refusing_server}: no such admin key" in sql.stderr

    silent = f"http://127.0.0.1:{free_port()}"
    named = onjob("export", "--parquet", str(tmp_path / "out"), "--server", silent)
    assert named.returncode == 2 and f"onjob export: {silent} did not answer" in named.stderr

    usage = onjob("train", "--snapshot", str(tmp_path / "s"))
    assert usage.returncode == 2 and usage.stderr == "onjob train: --snapshot needs --out\n"


def test_a_key_file_others_can_read_is_a_refusal_not_a_crash(tmp_path):
    """Was exit 1 (SystemExit with a message); a refusal like every other."""
    db = tmp_path / "x.duckdb"
    key = tmp_path / "x.duckdb.admin-key"
    key.write_text("onjob-admin-k\n")
    key.chmod(0o644)
    done = onjob("serve", "--db", str(db), "--port", str(free_port()))
    assert done.returncode == 2
    assert "onjob serve: " in done.stderr and "can be read by others" in done.stderr


def test_a_settings_file_naming_a_setting_onjob_lacks_is_refused_naming_each(tmp_path):
    """pydantic would ignore an unknown key, and the server would run without what the
    file asks: a typo is named with the setting it is closest to, a removed setting with
    what became of it, and nothing starts; an old name still read (`loop.sprt_delta`) is
    not refused."""
    config = tmp_path / "onjob.toml"
    config.write_text(
        '[proxy]\nupstream_client = "aiohttp"\nport = 1\n'
        "[loop]\nsprt_delta = 0.3\nintervl_s = 5\n[loop.gate]\nrewardz = {}\n[nosuch]\na = 1\n"
    )
    done = onjob("serve", "--config", str(config), "--db", str(tmp_path / "x.duckdb"))
    assert done.returncode == Exit.REFUSED
    assert done.stderr.splitlines() == [
        f"onjob serve: {config}: `proxy.upstream_client` was removed: the proxy has one "
        "engine client now; delete the line",
        f"onjob serve: {config}: `loop.intervl_s` is not a setting (did you mean "
        "`loop.interval_s`?)",
        f"onjob serve: {config}: `loop.gate.rewardz` is not a setting (did you mean "
        "`loop.gate.rewards`?)",
        f"onjob serve: {config}: `nosuch` is not a setting",
    ]
    assert not (tmp_path / "x.duckdb").exists()


def test_a_check_that_ran_and_failed_exits_1():
    done = onjob("doctor", "--engine-url", f"http://127.0.0.1:{free_port()}/v1", "--timeout", "5")
    assert done.returncode == Exit.FAILED == 1
    assert done.stderr.endswith("onjob doctor: 1 missing\n")


def test_nothing_to_train_is_the_code_the_server_reads_from_its_trainer_child():
    from onjob.deploy.act.training import NOTHING_TO_TRAIN

    assert Exit.NOTHING == NOTHING_TO_TRAIN == 3


def test_a_snapshot_the_trainer_cannot_read_is_said_in_one_line_with_exit_1(tmp_path):
    """pyarrow's error is the trainer's `IOFailed`, not a traceback."""
    snapshot = tmp_path / "snapshot.parquet"
    snapshot.write_bytes(b"not parquet")
    done = onjob("train", "--snapshot", str(snapshot), "--out", str(tmp_path / "ckpt"))
    assert done.returncode == Exit.FAILED, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("onjob train: ") and "parquet" in done.stderr.lower()


def test_a_taken_port_is_one_line_with_exit_2_and_nothing_is_made(tmp_path):
    """Was uvicorn's raw `[Errno 98]` after the banner, a new database and admin key, with
    exit 3 (the table's "nothing to do")."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = onjob("serve", "--db", str(tmp_path / "x.duckdb"), "--port", str(port))
    assert done.returncode == Exit.REFUSED
    assert done.stderr.splitlines() == [
        f"onjob serve: cannot listen on 127.0.0.1:{port}: Address already in use (another "
        "server on it? stop that one, or choose another port with --port or [proxy] port)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_reward_function_that_does_not_import_stops_serve_in_one_line(tmp_path):
    """Was a server that started and then logged the import error at every loop iteration,
    learning nothing."""
    (tmp_path / "my_rewards.py").write_text("def correct(r):\n    return 1.0\n")
    config = '[judge.rewards]\nc = { fn = "my_reward:correct" }\n'  # the module misspelt
    (tmp_path / "onjob.toml").write_text(config)
    port = str(free_port())
    done = onjob("serve", "--db", str(tmp_path / "x.duckdb"), "--port", port, cwd=tmp_path)
    assert done.returncode == Exit.REFUSED, done.stderr
    assert done.stderr.splitlines() == [
        "onjob serve: reward function c = 'my_reward:correct': No module named 'my_reward' "
        "(a module is imported from beside onjob.toml, from the directory onjob runs in, "
        f"{tmp_path}, or from PYTHONPATH)"
    ]


def test_a_reward_module_beside_onjob_toml_imports_from_any_directory(tmp_path, fake_engine_url):
    """The README's `my_rewards.py beside onjob.toml`, with `onjob serve --config` run
    from another directory (this test's): it starts."""
    (tmp_path / "my_rewards_beside.py").write_text("def correct(r):\n    return 1.0\n")
    config = tmp_path / "onjob.toml"
    config.write_text('[judge.rewards]\nc = { fn = "my_rewards_beside:correct" }\n')
    args = ["--config", str(config), "--engine-url", fake_engine_url]
    with ServerProcess([*args, "--db", str(tmp_path / "x.duckdb")]) as server:
        assert "my_rewards_beside" not in server.output()
    assert Path.cwd() != tmp_path


def test_a_misspelt_environment_variable_is_refused_like_a_file_typo(tmp_path):
    env = {**os.environ, "ONJOB_PROXY__PORTT": "9000", "ONJOB_LOOPP__INTERVAL_S": "5"}
    done = subprocess.run(
        [sys.executable, "-m", "onjob.cli", "serve", "--db", str(tmp_path / "x.duckdb")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == Exit.REFUSED
    assert done.stderr.splitlines() == [
        "onjob serve: environment variable ONJOB_LOOPP__INTERVAL_S: `loopp` is not a setting "
        "(did you mean `loop`?)",
        "onjob serve: environment variable ONJOB_PROXY__PORTT: `proxy.portt` is not a setting "
        "(did you mean `proxy.port`?)",
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_variable_no_setting_reads_is_warned_with_the_spelling_it_meant(tmp_path):
    """`ONJOB_PROXY_PORT` (one underscore where the section nests with two) was ignored
    without a word, and the server ran on the default port. Warned, not refused: the
    engine's `ONJOB_ENGINE_<FLAG>`, `ONJOB_CONFIG` and `ONJOB_CACHE_DIR` are read elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONJOB_")}
    env |= {
        "ONJOB_PROXY_PORT": str(free_port()),
        "ONJOB_LOOP_GATE_REWARDS": "{}",
        "ONJOB_PROXYY": "1",
        "ONJOB_ENGINE_THREADS": "1",
        "ONJOB_CACHE_DIR": str(tmp_path / "cache"),
        "ONJOB_LOOP__INTERVAL_S": "5",
    }
    nowhere = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "onjob.cli", "status", "--server", nowhere],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == Exit.REFUSED  # no server, no database: said after the warnings
    assert done.stderr.splitlines()[:3] == [
        "onjob status: warning: environment variable ONJOB_LOOP_GATE_REWARDS is not read: a "
        "section and its setting are joined by two underscores (did you mean "
        "ONJOB_LOOP__GATE__REWARDS?)",
        "onjob status: warning: environment variable ONJOB_PROXYY is not read: it names no "
        "setting (settings are ONJOB_<SECTION>__<SETTING>)",
        "onjob status: warning: environment variable ONJOB_PROXY_PORT is not read: a section "
        "and its setting are joined by two underscores (did you mean ONJOB_PROXY__PORT?)",
    ]
    assert "no server answered" in done.stderr.splitlines()[3]


def test_serve_warns_once_whatever_its_workers(tmp_path, fake_engine_url):
    """Each `--workers` process reads the same environment; the primary alone says it."""
    args = ["--engine-url", fake_engine_url, "--db", str(tmp_path / "o.duckdb"), "--workers", "3"]
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_COLLECTOR_DB": str(tmp_path / "elsewhere")}
    with ServerProcess(args, env=env, log=tmp_path / "serve.log") as server:
        pids, deadline = set(), time.monotonic() + 60
        while len(pids) < 3 and time.monotonic() < deadline:  # each has read its settings
            health = httpx.get(f"{server.base}/health", headers=admin_of(server), timeout=10)
            pids.add(health.json()["pid"])
        assert len(pids) == 3
    said = (tmp_path / "serve.log").read_text()
    warning = (
        "onjob serve: warning: environment variable ONJOB_COLLECTOR_DB is not read: a section "
        "and its setting are joined by two underscores (did you mean ONJOB_COLLECTOR__DB?)"
    )
    assert said.count(warning) == 1, said


def test_version_and_help_say_it_plainly():
    from onjob import __version__

    version = onjob("--version")
    assert (version.returncode, version.stdout) == (Exit.OK, f"onjob {__version__}\n")
    compare = onjob("compare", "--help")
    assert "95% Wilson interval" in " ".join(compare.stdout.split())


def test_status_with_no_server_and_no_database_says_so_and_makes_none(tmp_path):
    """Was "agent: live base / 0 checkpoints" from a new ./onjob.duckdb it had just made."""
    done = onjob("status", "--server", f"http://127.0.0.1:{free_port()}", cwd=tmp_path)
    assert done.returncode == Exit.REFUSED
    assert done.stderr == (
        "onjob status: no server answered and there is no database at onjob.duckdb: start "
        "`onjob serve`, or name yours with --server URL or --db PATH\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_sql_with_no_server_and_no_database_says_what_status_says(tmp_path):
    """Was "no database at onjob.duckdb", with no word of the server it had asked or of
    how to name either."""
    env = {**os.environ, "ONJOB_PROXY__PORT": str(free_port())}  # where no server listens
    env.pop("ONJOB_PROXY__ADMIN_KEY", None)
    said = {}
    for command in (["status"], ["sql", "SELECT 1"]):
        done = subprocess.run(
            [sys.executable, "-m", "onjob.cli", *command],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
        )
        assert done.returncode == Exit.REFUSED, done.stderr
        said[command[0]] = done.stderr.removeprefix(f"onjob {command[0]}: ")
    hint = (
        "no server answered and there is no database at onjob.duckdb: start `onjob serve`, "
        "or name yours with --server URL or --db PATH\n"
    )
    assert said == {"status": hint, "sql": hint}
    assert list(tmp_path.iterdir()) == []


def test_a_model_that_is_not_there_is_one_line_from_the_engine_and_from_serve(tmp_path):
    """Was a 17-line traceback from the engine child before the one line that says why."""
    why = (
        "'/no/such/model' is not a local model directory (no config.json); models cannot be "
        "downloaded here. Use the bundled model (omit --model) or a directory saved with "
        "save_pretrained."
    )
    engine = onjob("engine", "--model", "/no/such/model", "--port", str(free_port()))
    assert (engine.returncode, engine.stderr) == (Exit.REFUSED, f"onjob engine: {why}\n")
    url = f"http://127.0.0.1:{free_port()}/v1"
    serve = onjob(
        "serve", "--start-engine", "--model", "/no/such/model", "--engine-url", url,
        "--db", str(tmp_path / "x.duckdb"), "--port", str(free_port()),
    )  # fmt: skip
    assert serve.returncode == Exit.REFUSED
    assert f"onjob serve: onjob engine: {why}" in serve.stderr
    assert "Traceback" not in serve.stderr


def test_output_piped_into_head_ends_quietly_with_the_shells_status(tmp_path):
    """`onjob sql ... | head -1` printed a BrokenPipeError traceback and exited 1."""
    db = tmp_path / "onjob.duckdb"
    Store(db).close()
    query = "SELECT range AS n FROM range(100000)"  # more than a pipe's buffer holds
    onjob_sql = f"{sys.executable} -m onjob.cli sql --db {db} --limit 100000"
    cmd = f"{onjob_sql} '{query}' 2>{tmp_path / 'err'} | head -1"
    done = subprocess.run(
        ["bash", "-c", cmd + "; echo ${PIPESTATUS[0]}"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.stdout.split() == ["n", "141"]
    assert (tmp_path / "err").read_text() == ""
