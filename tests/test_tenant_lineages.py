"""One adapter per tenant, through a real `onjob serve`, real `onjob loop` iterations and a
real engine with real adapters, driven by the `openai` client: each tenant's keys train
only their own lineage (read back from the training snapshots), each key is served its own
lineage's live adapter, a promotion for one tenant changes nothing for another, and a key
no tenant holds is served by the shared lineage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from openai import OpenAI
from pydantic import ValidationError

from onjob.cli.process import ServerProcess, free_port
from onjob.proxy import ProxySettings

from .conftest import TOOL_QUESTION, TOOLS, rows
from .test_loop import REWARDS, TRAIN

ONJOB = str(Path(sys.executable).with_name("onjob"))
KEYS = {"acme-1": "sk-acme-1-4f0b", "acme-2": "sk-acme-2-9c1e", "beta": "sk-beta-77d2",
        "solo": "sk-solo-03aa"}  # fmt: skip
TENANTS = {"acme": ["acme-1", "acme-2"], "beta": ["beta"]}
LINEAGE_OF_KEY = {"acme-1": "agent@acme", "acme-2": "agent@acme", "beta": "agent@beta",
                  "solo": "agent"}  # fmt: skip
# The training settings of `test_loop` (its [loop] table last), with tenants and keys.
CONFIG = (
    """
[proxy]
admin_key = "adm-lineages-5e1d"
api_keys = {keys}
tenants = {tenants}
"""
    + TRAIN
    + "holdout_share = 0  # one scenario per key here: a held-out one would never train\n"
    + "interval_s = 0  # the servers here only serve: `onjob loop --once` iterates\n"
)


def onjob(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    nowhere = ["--server", f"http://127.0.0.1:{free_port()}"]  # no server: offline change
    done = subprocess.run(
        [ONJOB, *args, *(nowhere if args[0] in ("promote", "status") else [])],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(cwd)},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def serve(cwd: Path, engine_url: str) -> ServerProcess:
    args = ["--engine-url", engine_url, "--db", str(cwd / "onjob.duckdb")]
    return ServerProcess([*args, "--config", str(cwd / "onjob.toml")], log=cwd / "server.log")


def ask(server: ServerProcess, key: str, name: str, **extra) -> tuple[str, str]:
    """One tool question as `key`; the arm and the exchange id the proxy answered with."""
    client = OpenAI(base_url=server.url, api_key=KEYS[key], max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model="agent",
        messages=TOOL_QUESTION,
        tools=TOOLS,
        max_tokens=24,
        metadata={"trajectory_id": name},
        **extra,
    )
    raw.parse()
    return raw.headers["x-onjob-arm"], raw.headers["x-onjob-exchange-id"]


@pytest.fixture
def workdir(tmp_path: Path, tool_model_dir: Path) -> Path:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "onjob.toml").write_text(
        CONFIG.replace("{keys}", _toml(KEYS))
        .replace("{tenants}", _toml(TENANTS))
        .replace("{model}", str(tool_model_dir))
    )
    return tmp_path


def _toml(mapping: dict) -> str:
    return "{ " + ", ".join(f'"{k}" = {json.dumps(v)}' for k, v in mapping.items()) + " }"


def test_each_tenant_trains_and_is_served_its_own_lineage(workdir: Path, tool_engine):
    db = workdir / "onjob.duckdb"
    with serve(workdir, tool_engine.url) as server:
        for key in KEYS:
            for i in range(3):  # greedy: the logged answer calls the tool (a spread to learn)
                ask(server, key, f"{key}-{i}", temperature=0)
    # Three iterations: the trainer goes round the lineages with groups ready, one run each.
    said = "".join(onjob(workdir, "loop", "--once", "--engine-url", tool_engine.url).stdout
                   for _ in range(3))  # fmt: skip
    runs = rows(
        db,
        "SELECT c.name, c.status, json_extract_string(t.config, '$.lineage') AS lineage "
        "FROM checkpoints c JOIN train_runs t ON t.id = c.train_run",
    )
    assert sorted(r["lineage"] for r in runs) == ["agent", "agent@acme", "agent@beta"], said
    trained = {r["lineage"]: r["name"] for r in runs}
    assert all(r["status"] == "canary" for r in runs), said

    # Each snapshot's rows are of its own lineage's keys, and of every key it holds.
    for lineage, name in trained.items():
        snap = pq.read_table(workdir / "checkpoints" / ".snapshots" / f"{name}.parquet")
        ids = [i for turns in snap.column("exchange_ids").to_pylist() for i in turns]
        keys = {r["api_key_id"] for r in rows(
            db, "SELECT DISTINCT api_key_id FROM exchanges WHERE list_contains(?, id)", [ids]
        )}  # fmt: skip
        assert keys and {LINEAGE_OF_KEY[k] for k in keys} == {lineage}, (lineage, keys)

    # A promotion for acme: its canary becomes its live; beta's and the shared routing stay.
    onjob(workdir, "promote", "agent", "--tenant", "acme", "--reason", "test")
    routing = {r["model_alias"]: r for r in rows(
        db, "SELECT * FROM deployments QUALIFY row_number() OVER "
        "(PARTITION BY model_alias ORDER BY ts DESC) = 1"
    )}  # fmt: skip
    assert (routing["agent@acme"]["live"], routing["agent@acme"]["canary"]) == (
        trained["agent@acme"],
        None,
    )
    for other in ("agent@beta", "agent"):
        assert (routing[other]["live"], routing[other]["canary"]) == (None, trained[other])
    shown = onjob(workdir, "status").stdout
    assert f"agent@acme: live {trained['agent@acme']}  [tenant acme: acme-1, acme-2]" in shown
    assert f"agent@beta: live base, canary {trained['agent@beta']} (50%)  [tenant beta" in shown
    assert "agent: live base, canary" in shown and "[shared: every key no tenant holds]" in shown

    with serve(workdir, tool_engine.url) as server:
        served = {}
        for key in KEYS:
            arm, exchange = ask(server, key, f"{key}-after", extra_headers={"X-Onjob-Arm": "live"})
            served[key] = exchange
            if LINEAGE_OF_KEY[key] == "agent@acme":
                continue  # promoted: no canary left
            # The canary pinned: each key gets its own lineage's canary, never another's.
            arm, exchange = ask(
                server, key, f"{key}-canary", extra_headers={"X-Onjob-Arm": "canary"}
            )
            assert arm == "canary"
            served[f"{key}/canary"] = exchange
        # A key may not pin another tenant's adapter by name.
        client = OpenAI(base_url=server.url, api_key=KEYS["beta"], max_retries=0, timeout=60)
        with pytest.raises(Exception, match=r"403|not a checkpoint"):
            client.chat.completions.create(
                model="agent",
                messages=TOOL_QUESTION,
                max_tokens=4,
                extra_headers={"X-Onjob-Arm": trained["agent@acme"]},
            )
        status = httpx.get(
            f"{server.base}/admin/status",
            headers={"Authorization": "Bearer adm-lineages-5e1d"},
            timeout=30,
        ).json()
        # One tenant's export through the running server (streamed back over HTTP).
        onjob(workdir, "export", "--parquet", "acme-live", "--tenant", "acme",
              "--server", server.base)  # fmt: skip
    logged = {r["id"]: r for r in rows(db, "SELECT id, checkpoint, api_key_id FROM exchanges")}
    # acme's keys: its promoted adapter; beta and solo: their live is still the base model.
    assert logged[served["acme-1"]]["checkpoint"] == trained["agent@acme"]
    assert logged[served["acme-2"]]["checkpoint"] == trained["agent@acme"]
    assert logged[served["beta"]]["checkpoint"] is None
    assert logged[served["solo"]]["checkpoint"] is None
    assert logged[served["beta/canary"]]["checkpoint"] == trained["agent@beta"]
    assert logged[served["solo/canary"]]["checkpoint"] == trained["agent"]
    # Over the whole log: no key was ever answered by another lineage's adapter.
    for row in logged.values():
        if row["checkpoint"] is not None:
            owner = next(lin for lin, name in trained.items() if name == row["checkpoint"])
            assert owner == LINEAGE_OF_KEY[row["api_key_id"]], row
    # One tenant's export, from the database file: its keys' rows and its lineage's, whole.
    onjob(workdir, "export", "--parquet", "acme", "--tenant", "acme", "--db", str(db))
    exported_tenant(workdir / "acme", db, trained["agent@acme"])
    exported_tenant(workdir / "acme-live", db, trained["agent@acme"])
    refused = subprocess.run(
        [ONJOB, "export", "--parquet", "zeta", "--tenant", "zeta", "--db", str(db)],
        cwd=workdir, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "no tenant 'zeta' (tenants: acme, beta)" in refused.stderr
    assert set(status["aliases"]) == {"agent", "agent@acme", "agent@beta"}
    assert status["aliases"]["agent@acme"]["live"] == trained["agent@acme"]
    assert status["tenants"] == TENANTS
    for name in trained.values():
        httpx.post(f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def exported_tenant(out: Path, db: Path, checkpoint: str) -> None:
    """`onjob export --tenant acme` wrote acme's rows, all of them, and no other's."""
    files = {p.stem for p in out.glob("*.parquet")}
    assert {"exchanges", "groups", "members", "train_runs", "checkpoints"} <= files
    assert not files & {"loaded_segments", "forgotten", "openings", "export_queue"}, files
    exchanges = pq.read_table(out / "exchanges.parquet").to_pylist()
    acme = rows(
        db,
        "SELECT id FROM exchanges WHERE trajectory_id IN (SELECT trajectory_id FROM "
        "exchanges WHERE api_key_id IN ('acme-1', 'acme-2'))",
    )
    assert sorted(e["id"] for e in exchanges) == sorted(r["id"] for r in acme)
    assert {e["api_key_id"] for e in exchanges} <= {"acme-1", "acme-2", None}
    assert all(json.loads(e["request"])["messages"] for e in exchanges)  # whole requests
    members = pq.read_table(out / "members.parquet").to_pylist()
    assert members and {m["exchange_id"] for m in members} <= {e["id"] for e in exchanges}
    runs = pq.read_table(out / "train_runs.parquet").to_pylist()
    assert [json.loads(r["config"])["lineage"] for r in runs] == ["agent@acme"]
    assert pq.read_table(out / "checkpoints.parquet").column("name").to_pylist() == [checkpoint]
    routed = set(pq.read_table(out / "deployments.parquet").column("model_alias").to_pylist())
    assert routed == {"agent@acme"}


@pytest.mark.parametrize(
    ("tenants", "error"),
    [
        ({"acme": ["nobody"]}, "'nobody' is not in proxy.api_keys"),
        ({"acme": ["acme-1"], "beta": ["acme-1"]}, "is in tenants 'acme' and 'beta'"),
        ({"a@b": ["acme-1"]}, "tenant name"),
        ({"acme": []}, "holds no API key"),
    ],
)
def test_a_tenant_setting_that_cannot_hold_is_refused_by_name(tenants, error):
    with pytest.raises(ValidationError, match=error):
        ProxySettings(api_keys=KEYS, tenants=tenants)


def test_a_tenant_of_untrained_keys_gets_no_lineage():
    with pytest.raises(ValidationError, match="untrained_keys, so it gets no lineage"):
        ProxySettings(api_keys=KEYS, tenants={"acme": ["acme-1"]}, untrained_keys=["acme-1"])
