"""The loop through `onjob loop --once`, with real traffic, a real engine and the real
decision rule: a harmful canary is rolled back and a better one promoted by the paired
comparison on traffic logged after it started; a winning canary that has not served
enough conversations waits; a fresh database runs every stage; a run killed mid-train
resumes cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Store
from onjob.deploy.act import registry
from onjob.deploy.loop import LoopState

from .conftest import TOOL_QUESTION, TOOLS, admin_of, make_adapter, record_trained, rows

ONJOB = str(Path(sys.executable).with_name("onjob"))
TARGETS = ["q_proj", "v_proj", "o_proj"]
REWARDS = (
    "def tool(r):\n    return any(c['function']['name'] == 'get_weather' for c in r.tool_calls)\n"
    "def varied(r):\n    return sum(map(ord, str(r.tool_calls))) % 3 / 2\n"  # a spread
)


ROUTING = {"canary", "promote", "rollback", "status"}
ROME = [{"role": "user", "content": "What is the weather in Rome?"}]


def onjob(cwd: Path, *args: str, env: dict | None = None, timeout: float = 600):
    nowhere = ["--server", f"http://127.0.0.1:{free_port()}"] if args[0] in ROUTING else []
    return subprocess.run(
        [ONJOB, *args, *nowhere],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def converse(
    db: Path, engine_url: str, n: int, name: str, messages=TOOL_QUESTION, **request
) -> None:
    """`n` one-turn tool-question conversations through a real `onjob serve` on `db`
    (routing restored from its deployments, adapters loaded), named `name-<i>`; `request`
    adds to each request (sampling, `extra_headers`)."""
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", engine_url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        for i in range(n):
            client.chat.completions.create(
                model="agent",
                messages=messages,
                tools=TOOLS,
                max_tokens=24,
                metadata={"trajectory_id": f"{name}-{i}"},
                **request,
            )


def assert_compared_since(sql_rows, stdout: str) -> None:
    """The canary's round drew pairs from the "after-" conversations. Unless a quarter of
    the UTC day ended between the "conv-" ones it trained on and them: a test's draw keeps
    the day's mix of turns, quarter by quarter (`deploy/decide/prompts.py`), so a quarter
    whose turns were all trained on ends the round when drawn, and the loop says it waits
    for that quarter's traffic. `sql_rows(sql)`: the log's rows, as tuples."""
    part = "CAST(hour(timezone('UTC', ts)) // 6 AS INTEGER)"

    def parts(name: str) -> set[int]:
        sql = f"SELECT DISTINCT {part} FROM exchanges WHERE trajectory_id LIKE '{name}-%'"
        return {p for (p,) in sql_rows(sql)}

    if parts("conv") - parts("after"):  # rare: logged either side of 00, 06, 12 or 18 UTC
        assert "the test waits for more " in stdout, stdout
    else:
        [(pairs,)] = sql_rows("SELECT count(*) FROM groups WHERE kind = 'ab'")
        assert pairs >= 1, stdout


@pytest.fixture(scope="module")
def traffic(tmp_path_factory, tool_engine) -> Path:
    """A database with 12 logged tool-question conversations, served by the base model."""
    db = tmp_path_factory.mktemp("traffic") / "onjob.duckdb"
    # Greedy: the base model's logged answer calls the tool every time. Sampled, it
    # sometimes did not, and then no re-sampled alternative did either (temperature 1.5),
    # which left the training test nothing with a spread to train on.
    converse(db, tool_engine.url, 12, "conv", temperature=0)
    return db


def workdir(tmp_path: Path, traffic: Path, config: str) -> Path:
    (tmp_path / "onjob.duckdb").write_bytes(traffic.read_bytes())
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "onjob.toml").write_text(config)
    return tmp_path / "onjob.duckdb"


# Coach only: no referee, so the loop promotes nothing by itself (review mode).
COACH_ONLY = """
[judge]
temperature = 0
max_groups = 0
scenario_groups = false
[judge.rewards]
tool = { fn = "my_rewards:tool" }
[loop]
pairs_per_round = 12
min_pairs = 10
sprt_delta = 0.3
min_guard_conversations = 2
"""
# With a referee (loop.gate): the loop decides by itself.
COMPARE_ONLY = (
    COACH_ONLY
    + """
[loop.gate.rewards]
tool = { fn = "my_rewards:tool" }
"""
)


def with_routing(tmp_path, tool_model_dir, live: str, canary: str) -> None:
    """Adapters built to differ: `mild` barely moves the tool model (it still calls the
    tool), `scrambled` breaks it. `live` is made live by hand, `canary` set as its canary
    for 30% of conversations."""
    store = Store(tmp_path / "onjob.duckdb")
    for name, std, seed in (("mild", 0.001, 4), ("scrambled", 0.5, 5)):
        path = make_adapter(
            tool_model_dir, tmp_path / name, seed=seed, r=8, targets=TARGETS, std=std
        )
        registry.add(store, path, name, tool_model_dir)
    store.close()
    steps = (("canary", "agent", live), ("promote", "agent"))
    steps += (("canary", "agent", canary, "--fraction", "0.3"),)
    for args in steps:
        done = onjob(tmp_path, *args)
        assert done.returncode == 0, done.stderr


@pytest.fixture
def unload(tool_engine):
    yield
    for name in ("mild", "scrambled"):
        httpx.post(f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


@pytest.mark.parametrize(
    ("live", "canary", "said", "tally"),
    [
        # the scrambled one runs to max_tokens: the truncation guard or the pairs stop it
        ("mild", "scrambled", "rollback: ", '"losses": 12'),
        ("scrambled", "mild", "promote: canary mild won", '"wins": 12'),
    ],
    ids=["harmful-canary-rolled-back", "better-canary-promoted"],
)
def test_the_paired_comparison_decides_the_canary(
    tmp_path, traffic, tool_engine, tool_model_dir, unload, live, canary, said, tally
):
    db = workdir(tmp_path, traffic, COMPARE_ONLY)
    with_routing(tmp_path, tool_model_dir, live=live, canary=canary)
    # Traffic while the canary runs: enough of each kind of turn (an answer, a tool call)
    # that the draw, which keeps the day's mix of them, finds its 12 prompts.
    converse(db, tool_engine.url, 48, "after")
    done = onjob(tmp_path, "loop", "--once", "--engine-url", tool_engine.url)
    assert done.returncode == 0, done.stderr
    assert f"canary {canary} against {live}: {said}" in done.stdout
    last = rows(db, "SELECT * FROM deployments ORDER BY ts DESC LIMIT 1")[0]
    # Either way `mild` (the one that still calls the tool) ends up live, by the rule.
    assert (last["live"], last["canary"], last["actor"]) == ("mild", None, "loop")
    assert tally in last["evidence"] and '"e_value"' in last["evidence"]
    pairs = rows(db, "SELECT count(*) AS n FROM groups WHERE kind = 'ab' AND status = 'scored'")
    assert pairs[0]["n"] == 12
    statuses = {r["name"]: r["status"] for r in rows(db, "SELECT * FROM checkpoints")}
    assert statuses == {"mild": "live", "scrambled": "retired"}
    # The prompts: live-arm turns of conversations started after the canary, one each.
    prompts = rows(
        db,
        "SELECT p.trajectory_id, p.arm FROM groups g JOIN exchanges p ON p.id = g.prefix_exchange "
        "WHERE g.kind = 'ab'",
    )
    assert all(p["arm"] == "live" and p["trajectory_id"].startswith("after-") for p in prompts)
    assert len({p["trajectory_id"] for p in prompts}) == len(prompts)


def test_a_canary_judged_by_its_coach_alone_is_ready_for_review_not_promoted(
    tmp_path, traffic, tool_engine, tool_model_dir, unload
):
    """No loop.gate (the default): the canary wins every pair under the reward it would be
    trained on, which a candidate that learned to game that reward would do too. The loop
    stops at "ready for review"; the evidence is in `onjob status`, the admin API and the
    dashboard; `onjob promote` is a person's call. Real engine, adapters and server."""
    db = workdir(tmp_path, traffic, COACH_ONLY)
    with_routing(tmp_path, tool_model_dir, live="scrambled", canary="mild")
    converse(db, tool_engine.url, 24, "after")
    done = onjob(tmp_path, "loop", "--once", "--engine-url", tool_engine.url)
    assert done.returncode == 0, done.stderr
    assert "canary mild against scrambled: ready for review: canary mild won" in done.stdout
    last = rows(db, "SELECT * FROM deployments ORDER BY ts DESC LIMIT 1")[0]
    assert (last["live"], last["canary"]) == ("scrambled", "mild")  # not promoted
    statuses = {r["name"]: r["status"] for r in rows(db, "SELECT * FROM checkpoints")}
    assert statuses == {"mild": "review", "scrambled": "live"}
    offline = onjob(tmp_path, "status")
    assert "READY FOR REVIEW agent: canary mild" in offline.stdout, offline.stdout
    assert "12 wins, 0 ties, 0 losses of 12" in offline.stdout

    env = {"ONJOB_LOOP__INTERVAL_S": "3600"}
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)], env=env) as server:
        assert "onjob serve: release mode review: no loop.gate" in server.output()
        admin = admin_of(server)  # the key the server made at its first start
        status = httpx.get(f"{server.base}/admin/status", headers=admin, timeout=30).json()
        assert status["release"]["mode"]["mode"] == "review"
        assert status["release"]["reviews"]["agent"]["checkpoint"] == "mild"
        page = httpx.get(f"{server.base}/dashboard/ab", headers=admin, timeout=30).text
        assert "Ready for review" in page and "onjob promote agent" in page
        said = subprocess.run(
            [ONJOB, "promote", "agent", "--server", server.base],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert said.returncode == 0, said.stderr
    last = rows(db, "SELECT * FROM deployments ORDER BY ts DESC LIMIT 1")[0]
    assert (last["live"], last["canary"], last["actor"]) == ("mild", None, "admin-api")


def test_a_winning_canary_that_has_served_too_few_conversations_waits(
    tmp_path, traffic, tool_engine, tool_model_dir, unload
):
    db = workdir(
        tmp_path, traffic, COMPARE_ONLY.replace("conversations = 2", "conversations = 1000")
    )
    with_routing(tmp_path, tool_model_dir, live="scrambled", canary="mild")
    converse(db, tool_engine.url, 24, "after")
    done = onjob(tmp_path, "loop", "--once", "--engine-url", tool_engine.url)
    assert done.returncode == 0, done.stderr
    assert "canary mild against scrambled: wait: canary mild won the pairs, but" in done.stdout
    assert "the guards need 1000 turns served per arm" in done.stdout
    last = rows(db, "SELECT * FROM deployments ORDER BY ts DESC LIMIT 1")[0]
    assert (last["live"], last["canary"]) == ("scrambled", "mild")  # nothing changed


def test_traffic_from_before_the_canary_is_never_a_comparison_prompt(
    tmp_path, traffic, tool_engine, tool_model_dir, unload
):
    workdir(tmp_path, traffic, COMPARE_ONLY)
    with_routing(tmp_path, tool_model_dir, live="scrambled", canary="mild")
    done = onjob(tmp_path, "loop", "--once", "--engine-url", tool_engine.url)
    assert done.returncode == 0, done.stderr
    assert "canary mild against scrambled: wait: 0 wins, 0 ties, 0 losses in 0 pairs" in done.stdout


TRAIN = """
[judge]
group_size = 6
temperature = 1.5
scenario_groups = false
[judge.rewards]
tool = { fn = "my_rewards:tool" }
[trainer]
base_model = "{model}"
learning_rate = 0.005
epochs = 2
lora_rank = 8
[loop]
min_new_groups = 1
"""


def test_a_fresh_database_runs_every_stage_and_a_run_killed_mid_train_resumes_cleanly(
    tmp_path, traffic, tool_engine, tool_model_dir
):
    db = workdir(tmp_path, traffic, TRAIN.replace("{model}", str(tool_model_dir)))
    cmd = [ONJOB, "loop", "--once", "--engine-url", tool_engine.url]
    slow = {**os.environ, "ONJOB_TRAINER__EPOCHS": "5000"}
    killed = subprocess.Popen(
        cmd, cwd=tmp_path, env=slow, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    seen = []
    for line in killed.stdout:
        seen.append(line)
        if line.startswith("training on"):
            break
    os.killpg(killed.pid, signal.SIGKILL)  # the loop and its training child
    killed.wait()
    assert any(line.startswith("training on") for line in seen), "".join(seen)
    assert rows(db, "SELECT count(*) AS n FROM checkpoints")[0]["n"] == 0
    assert not list((tmp_path / "checkpoints").glob("ckpt-*"))  # nothing anyone could load

    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded as a candidate" in done.stdout and "canary: ckpt-" in done.stdout
    [checkpoint] = rows(db, "SELECT * FROM checkpoints")
    assert checkpoint["status"] == "canary"
    assert rows(db, "SELECT count(*) AS n FROM train_runs")[0]["n"] == 1
    assert not list((tmp_path / "checkpoints").glob("*.partial"))
    # Both sides of the importance ratio on file: the trainer's dtypes and the engine's.
    manifest = json.loads(Path(checkpoint["path"], "onjob-manifest.json").read_text())
    assert manifest["precision"]["head_dtype"] == "torch.float32"
    sampler = manifest["precision"]["sampler"]
    assert sampler == {"model": "toolbot", "dtype": "float32", "logprobs": "raw_logprobs"}
    [deployment] = rows(db, "SELECT * FROM deployments")
    # The canary's share fitted to the traffic (deploy/decide/fit.py): a few conversations, half.
    assert deployment["canary"] == checkpoint["name"] and deployment["fraction"] == 0.5
    assert deployment["reason"].startswith("trained on")
    groups = rows(db, "SELECT kind, status FROM groups")
    assert groups and all(g["kind"] == "turn" for g in groups)
    # The next iteration compares the canary with live on prompts logged since it started.
    # Pinned live: a test draws fresh prompts from the live arm only, and six conversations
    # hashed at a fitted 50% all fall to the canary about once in 64 runs.
    # Another question: the candidate trained on the first one (a test draws no prompt in
    # the words of one it trained on).
    converse(db, tool_engine.url, 6, "after", ROME, extra_headers={"X-Onjob-Arm": "live"})
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"canary {checkpoint['name']} against base" in done.stdout
    assert_compared_since(lambda sql: [tuple(r.values()) for r in rows(db, sql)], done.stdout)
    httpx.post(
        f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": checkpoint["name"]}, timeout=60
    )


SKIP_WHILE_COMPARING = """
[judge]
group_size = 4
temperature = 1.0
max_groups = 6
scenario_groups = false
[judge.rewards]
varied = { fn = "my_rewards:varied" }
[loop]
min_new_groups = 1
pairs_per_round = 2
min_pairs = 10
"""


def test_while_comparing_the_loop_samples_no_more_than_the_next_run_needs(
    tmp_path, traffic, tool_engine, tool_model_dir, unload
):
    db = workdir(tmp_path, traffic, SKIP_WHILE_COMPARING)
    judged = onjob(tmp_path, "judge", "--once", "--engine-url", tool_engine.url)
    assert judged.returncode == 0, judged.stderr
    turn_groups = "SELECT count(*) AS n FROM groups WHERE kind = 'turn'"
    before = rows(db, turn_groups)[0]["n"]
    with_routing(tmp_path, tool_model_dir, live="mild", canary="scrambled")
    done = onjob(tmp_path, "loop", "--once", "--engine-url", tool_engine.url)
    assert done.returncode == 0, done.stderr
    assert "canary scrambled against mild: wait" in done.stdout  # the paired round ran
    assert "judge pass skipped while comparing" in done.stdout
    assert rows(db, turn_groups)[0]["n"] == before  # no turn re-sampled


def test_conversations_the_canary_trained_on_and_compare_runs_never_count_for_it(
    tmp_path, traffic, tool_engine, tool_model_dir, unload
):
    db = workdir(tmp_path, traffic, COMPARE_ONLY)
    env = {"ONJOB_JUDGE__MAX_GROUPS": "4", "ONJOB_JUDGE__PER_SCENARIO": "4"}
    judged = onjob(tmp_path, "judge", "--once", "--engine-url", tool_engine.url, env=env)
    assert judged.returncode == 0, judged.stderr
    with_routing(tmp_path, tool_model_dir, live="scrambled", canary="mild")
    # mild's parent was trained on the judged groups: their conversations are its lineage's.
    store = Store(db)
    groups = [r["id"] for r in store.dicts("SELECT id FROM groups WHERE kind = 'turn'")]
    record_trained(store, "mild-parent", tmp_path / "mild", tool_model_dir, groups=groups)
    store.con.execute("UPDATE checkpoints SET parent = 'mild-parent' WHERE name = 'mild'")
    trained = {
        r["trajectory_id"]
        for r in store.dicts(
            "SELECT DISTINCT trajectory_id FROM members WHERE group_id IN "
            "(SELECT id FROM groups WHERE kind = 'turn')"
        )
    }
    store.close()
    assert trained
    converse(db, tool_engine.url, 12, "conv")  # the same conversations go on...
    converse(db, tool_engine.url, 12, "after", ROME)  # ...and new ones start, on another
    # question: the lineage trained on the first (its words are not fresh prompts)
    cmp = onjob(tmp_path, "compare", "scrambled", "mild", "--prompts", "4",
                "--engine-url", tool_engine.url)  # fmt: skip
    assert cmp.returncode == 0, cmp.stderr
    done = onjob(tmp_path, "loop", "--once", "--engine-url", tool_engine.url)
    assert done.returncode == 0, done.stderr

    ab = rows(
        db,
        "SELECT g.test, p.trajectory_id FROM groups g JOIN exchanges p "
        "ON p.id = g.prefix_exchange WHERE g.kind = 'ab'",
    )
    canary_pairs = [r for r in ab if r["test"].startswith("canary:")]
    compare_pairs = [r for r in ab if r["test"].startswith("compare:")]
    assert len(compare_pairs) == 4 and canary_pairs
    assert not {r["trajectory_id"] for r in ab} & trained  # neither drew a trained one
    [decision] = rows(db, "SELECT * FROM deployments WHERE actor = 'loop'")
    assert f'"pairs": {len(canary_pairs)}' in decision["evidence"]  # compare's not counted


def test_the_loops_time_per_stage_counts_the_stage_under_way():
    # An offline test cut off by a benchmark's ceiling still shows the time it took.
    state = LoopState()
    with state.doing("offline test"):
        state.since -= 30  # the stage began half a minute ago
        seen = state.view()
    assert seen.stage == "offline test" and seen.seconds["offline test"] >= 30
    after = state.view()
    assert after.stage == "idle" and 30 <= after.seconds["offline test"] < 40
