"""The judge end to end: traffic from the `openai` client through a real `onjob serve` and
a real engine, then `onjob judge --once` (the installed command, as a user runs it)
re-samples, groups and scores it; every check reads the DuckDB file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from examples.arithmetic.demo import groups_formed
from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Store
from onjob.judge import tables
from onjob.judge.rollouts import common_prefix, from_row

from .conftest import TOOL_QUESTION, TOOLS, rows
from .fake_judge import FakeJudge, candidates, scores_json

ONJOB = str(Path(sys.executable).with_name("onjob"))
REWARDS = """
import random


def calls_weather(rollout):
    return any(c["function"]["name"] == "get_weather" for c in rollout.tool_calls)


def length(rollout):
    return min(len(rollout.text), 40) / 40


def broken(rollout):
    return "not a number"


def spread(rollout):
    return random.random()
"""


SEED = 1


@pytest.fixture(scope="module")
def logged(tmp_path_factory, tool_engine) -> dict:
    """A database of real traffic: two tool-using conversations that share a scenario (two
    turns each), and one plain question asked with n=2 that got feedback."""
    db = tmp_path_factory.mktemp("logged") / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        params = {"model": "agent", "tools": TOOLS, "max_tokens": 24, "temperature": 0}
        for _ in range(2):
            first = client.chat.completions.create(messages=TOOL_QUESTION, **params)
            reply = first.choices[0].message.model_dump(exclude_none=True)
            tool_result = {"role": "tool", "tool_call_id": "call-1", "content": '{"celsius": 21}'}
            if reply.get("tool_calls"):
                tool_result["tool_call_id"] = reply["tool_calls"][0]["id"]
            client.chat.completions.create(messages=[*TOOL_QUESTION, reply, tool_result], **params)
        # Seeded: the logged answers are the same each run, and one of them is cut at its
        # 6 tokens (the re-sampled ones draw afresh, and may all end before).
        hello = client.chat.completions.create(
            model="agent",
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=6,
            n=2,
            seed=SEED,
        )
        feedback = {"exchange_id": hello.id, "value": 0.75}
        assert httpx.post(f"{server.base}/v1/feedback", json=feedback).status_code in (200, 201)
    return {"db": db, "hello": hello.id, "engine": tool_engine.url}


def answers_of(db, group_id: str) -> dict[str, str]:
    store = Store(db)
    try:
        members = [from_row(r) for r in tables.members_of(store, group_id)]
    finally:
        store.close()
    n = common_prefix(members)
    return {r.member_id: json.dumps(r.messages[n:], sort_keys=True) for r in members}


def workdir(tmp_path: Path, logged: dict, config: str) -> Path:
    shutil.copy(logged["db"], tmp_path / "onjob.duckdb")
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "onjob.toml").write_text(config)
    return tmp_path / "onjob.duckdb"


def judge_once(cwd: Path, engine_url: str, *extra: str, env: dict | None = None) -> str:
    done = subprocess.run(
        [ONJOB, "judge", "--once", "--engine-url", engine_url, *extra],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


CONFIG = """
[judge]
group_size = 3
settle_s = 0
tool_turns_per_scenario = 0
truncated_reward = 0

[judge.rewards]
tool = { fn = "my_rewards:calls_weather", weight = 2.0 }
length = { fn = "my_rewards:length" }
"""


def test_judge_pass_makes_turn_groups_that_share_the_prefix_and_carry_tokens(tmp_path, logged):
    # Scores with a spread: when the sampled answers happen to score alike (all call the
    # tool, all past 40 characters), the scenario would go silent after two groups and the
    # second pass below would rightly skip it (that rule: test_learning_pace.py).
    config = CONFIG + 'spread = { fn = "my_rewards:spread" }\n'
    db = workdir(tmp_path, logged, config)
    out = judge_once(tmp_path, logged["engine"])
    # Five logged turns in two scenarios; at most two per scenario per pass (and no
    # tool-call turns besides them: `tool_turns_per_scenario = 0`).
    assert "3 turn groups" in out and "1 trajectory groups" in out, out

    members = rows(
        db,
        """
        SELECT g.id AS group_id, g.status, m.origin, m.choice, e.source, e.prompt_token_ids,
               e.completion_token_ids[m.choice + 1] AS ids,
               e.completion_logprobs[m.choice + 1] AS logprobs, e.request
        FROM groups g JOIN members m ON m.group_id = g.id
        JOIN exchanges_full e ON e.id = m.exchange_id  -- requests and prompts rebuilt whole
        WHERE g.kind = 'turn' ORDER BY g.id, m.position
        """,
    )
    groups: dict[str, list[dict]] = {}
    for m in members:
        groups.setdefault(m["group_id"], []).append(m)
    assert len(groups) == 3
    for group in groups.values():
        origins = [m["origin"] for m in group]
        assert origins.count("sampled") == 3 and origins[0] == "logged"
        assert {m["source"] for m in group} == {"production", "resample"}
        # Same prefix: same messages and tools, and the engine saw the same prompt tokens.
        assert len({json.dumps(json.loads(m["request"])["messages"]) for m in group}) == 1
        assert len({json.dumps(json.loads(m["request"]).get("tools")) for m in group}) == 1
        assert len({tuple(m["prompt_token_ids"]) for m in group}) == 1
        for m in group:
            assert m["ids"] and len(m["ids"]) == len(m["logprobs"])
            assert all(lp <= 0 for lp in m["logprobs"])
    # The n=2 question's group holds both logged choices.
    assert sorted(len(g) for g in groups.values()) == [4, 4, 5]

    # Re-sampled exchanges are not traffic: scenarios and trajectories are unchanged.
    assert rows(db, "SELECT sum(count) AS n FROM scenarios")[0]["n"] == 3
    assert rows(db, "SELECT count(*) AS n FROM trajectories")[0]["n"] == 3

    # The next pass takes the two turns left; the one after finds nothing new.
    assert "2 turn groups" in judge_once(tmp_path, logged["engine"])
    assert "0 turn groups" in judge_once(tmp_path, logged["engine"])
    assert rows(db, "SELECT count(*) AS n FROM groups WHERE kind = 'turn'")[0]["n"] == 5


def test_tool_call_turns_are_re_sampled_beside_the_scenarios_other_turns(tmp_path, logged):
    """A tool agent's conversations: each one's tool-call turn gets its group in the same
    pass, over the one turn per scenario `per_scenario` allows, and the scenario's
    finished conversations make a trajectory group."""
    # Sampled cooler than the default 1.0: the overfit tiny model's tool call is its most
    # likely answer but not a sure one at 1.0 (CI once drew three alternatives without it).
    config = CONFIG.replace("tool_turns_per_scenario = 0", "per_scenario = 1\ntemperature = 0.5")
    db = workdir(tmp_path, logged, config)
    out = judge_once(tmp_path, logged["engine"])
    # Both tool-call turns, one answer turn of their scenario, and the plain question.
    assert "4 turn groups" in out and "1 trajectory groups" in out, out
    turns = rows(
        db,
        """
        SELECT g.id, e.trajectory_id, e.response FROM groups g
        JOIN exchanges e ON e.id = g.prefix_exchange
        WHERE g.kind = 'turn' AND e.trajectory_id IN (
            SELECT trajectory_id FROM exchanges WHERE source = 'production'
            GROUP BY trajectory_id HAVING count(*) = 2)
        """,
    )
    assert len(turns) == 3
    called = [
        t for t in turns if json.loads(t["response"])["choices"][0]["message"].get("tool_calls")
    ]
    assert len({t["trajectory_id"] for t in called}) == 2
    # Their alternatives were sampled under the same tools, and the taught model calls
    # its tool in them too: groups a tool agent learns from.
    store = Store(db)
    try:
        for t in called:
            members = [from_row(r) for r in tables.members_of(store, t["id"])]
            assert len(members) == 4 and all(m.tools == TOOLS for m in members)
            assert any(m.tool_calls for m in members[1:])
        # What `onjob demo` reports of them.
        assert groups_formed(store) == {
            "tool_call_turn_groups": 2,
            "other_turn_groups": 2,
            "trajectory_groups": 1,
            "conversations_in_trajectory_groups": 2,
        }
    finally:
        store.close()


def test_reward_functions_are_combined_by_weight_and_feedback_only_some_members_have_is_kept_out(
    tmp_path, logged
):
    db = workdir(tmp_path, logged, CONFIG)
    judge_once(tmp_path, logged["engine"])
    scores = rows(
        db,
        """
        SELECT s.member_id, s.source, s.score, m.exchange_id, m.origin, g.kind
        FROM scores s JOIN members m ON m.id = s.member_id JOIN groups g ON g.id = s.group_id
        """,
    )
    by_member: dict[str, dict[str, float]] = {}
    for s in scores:
        by_member.setdefault(s["member_id"], {})[s["source"]] = s["score"]
    n_members = rows(db, "SELECT count(*) AS n FROM members")[0]["n"]
    assert len(by_member) == n_members
    feedback_members = {
        s["member_id"]
        for s in scores
        if s["exchange_id"] == logged["hello"] and s["origin"] == "logged"
    }
    assert len(feedback_members) == 2  # both logged choices of the question with feedback
    groups = [g["id"] for g in rows(db, "SELECT id FROM groups")]
    store = Store(db)
    try:
        cut = {
            r.member_id
            for g in groups
            for r in map(from_row, tables.members_of(store, g))
            if r.finish_reason == "length"
        }
    finally:
        store.close()
    # "Say hi." in 6 tokens is cut at its cap; the tool calls end on their own.
    assert cut and len(cut) < n_members
    for member_id, sources in by_member.items():
        assert {"fn:tool", "fn:length", "combined"} <= set(sources)
        weighted = 2 * sources["fn:tool"] + sources["fn:length"]
        if member_id in cut:  # judge.truncated_reward = 0: the coach pays nothing for it
            assert sources["combined"] == 0.0
            continue
        # Feedback is kept, but only the logged answers have it: it stays out of the reward,
        # which is on one footing for every member of the group.
        if member_id in feedback_members:
            assert sources["feedback"] == 0.75
        else:
            assert "feedback" not in sources
        assert sources["combined"] == pytest.approx(weighted / 3)
    # The tool-calling scenario's logged answers called the tool (the model was taught to).
    tool_scores = [s["score"] for s in scores if s["source"] == "fn:tool" and s["kind"] == "turn"]
    assert 1.0 in tool_scores
    statuses = rows(db, "SELECT DISTINCT status FROM groups")
    assert statuses == [{"status": "scored"}]


def test_a_broken_reward_function_fails_its_groups_with_the_reason(tmp_path, logged):
    config = CONFIG + 'bad = { fn = "my_rewards:broken" }\n'
    db = workdir(tmp_path, logged, config)
    out = judge_once(tmp_path, logged["engine"])
    assert "not a finite number" in out
    groups = rows(db, "SELECT status, reason FROM groups")
    assert groups and all(g["status"] == "failed" for g in groups)
    assert all("fn:bad returned 'not a number'" in g["reason"] for g in groups)
    # What the working functions said is kept; no combined reward is made up.
    sources = {r["source"] for r in rows(db, "SELECT DISTINCT source FROM scores")}
    assert sources == {"fn:tool", "fn:length", "feedback"}


def test_a_reward_function_that_does_not_import_stops_the_pass_with_a_clear_error(tmp_path, logged):
    workdir(tmp_path, logged, '[judge.rewards]\nx = { fn = "no_such_module:f" }\n')
    done = subprocess.run(
        [ONJOB, "judge", "--once", "--engine-url", logged["engine"]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "reward function x = 'no_such_module:f'" in done.stderr


def test_ruler_scores_groups_and_a_cached_judgement_makes_no_call(tmp_path, logged):
    def judge(call, body):
        return 200, "Scores:\n" + scores_json({i: i / 10 for i in candidates(body)})

    with FakeJudge(judge) as fake:
        # Turn groups only (the tool-call quota would add the conversations' other turns
        # and their trajectory group: tested on its own above).
        config = (
            f'[judge]\ngroup_size = 2\nsettle_s = 0\nbackoff_s = 0\napi_base = "{fake.url}"\n'
            "tool_turns_per_scenario = 0\n"
        )
        db = workdir(tmp_path, logged, config)
        out = judge_once(tmp_path, logged["engine"], "--model", "openai/judge")
        groups = rows(db, "SELECT id, status FROM groups ORDER BY created")
        assert len(groups) == 4 and {g["status"] for g in groups} == {"scored"}, out
        assert len(fake.calls) == 4 and "RULER: 4 calls" in out

        judgements = rows(db, "SELECT * FROM judgements")
        assert {j["status"] for j in judgements} == {"ok"}
        for j in judgements:
            # Scores follow the position the judge saw: candidate i got i/10.
            ruler = rows(
                db,
                "SELECT member_id, score FROM scores WHERE judgement_id = ?",
                [j["id"]],
            )
            got = {r["member_id"]: r["score"] for r in ruler}
            # Candidate i got i/10; members with the same answer share the mean of theirs.
            answers = answers_of(db, j["group_id"])
            shown = {m: (i + 1) / 10 for i, m in enumerate(j["member_order"])}
            for member_id, score in got.items():
                same = [m for m in shown if answers[m] == answers[member_id]]
                assert score == pytest.approx(sum(shown[m] for m in same) / len(same))
            assert j["prompt_tokens"] == 100 and j["attempts"] == 1

        # The same group judged again (same judge, rubric and answers) comes from the cache.
        group_id = groups[0]["id"]
        before = {
            r["member_id"]: r["score"]
            for r in rows(
                db,
                "SELECT member_id, score FROM scores WHERE group_id = ? AND source LIKE 'ruler:%'",
                [group_id],
            )
        }
        store = Store(db)
        store.dicts("DELETE FROM scores WHERE group_id = ?", [group_id])
        store.dicts("UPDATE groups SET status = 'sampled' WHERE id = ?", [group_id])
        store.close()
        rescore = {"ONJOB_JUDGE__MAX_GROUPS": "0"}  # no new turn groups this time
        out = judge_once(tmp_path, logged["engine"], "--model", "openai/judge", env=rescore)
        assert len(fake.calls) == 4 and "1 cache hits" in out, out
        after = rows(
            db,
            "SELECT member_id, score FROM scores WHERE group_id = ? AND source LIKE 'ruler:%'",
            [group_id],
        )
        assert {r["member_id"]: r["score"] for r in after} == before
        cached = rows(db, "SELECT * FROM judgements WHERE status = 'cached'")
        assert len(cached) == 1 and cached[0]["group_id"] == group_id


def test_ruler_on_the_local_engine_goes_through_and_a_garbage_answer_fails_the_group(
    tmp_path, logged, engine
):
    """The tiny random model is a real judge endpoint that cannot write JSON: each group is
    marked failed with the reason, with the tokens it cost, and gets no scores."""
    config = "[judge]\ngroup_size = 2\nsettle_s = 0\nattempts = 2\nbackoff_s = 0\n"
    config += "judge_max_tokens = 24\nscenario_groups = false\nmax_groups = 1\n"
    db = workdir(tmp_path, logged, config)
    out = judge_once(tmp_path, logged["engine"], "--model", "openai/tiny", "--api-base", engine.url)
    assert "RULER: 1 calls" in out, out
    group = rows(db, "SELECT * FROM groups")[0]
    assert group["status"] == "failed" and "no JSON with scores" in group["reason"]
    judgement = rows(db, "SELECT * FROM judgements")[0]
    assert judgement["attempts"] == 2 and judgement["prompt_tokens"] > 100
    assert judgement["completion_tokens"] > 0 and judgement["answer"]
    # Feedback posted on the logged answer is kept; nothing else is made up.
    assert rows(db, "SELECT count(*) AS n FROM scores WHERE source <> 'feedback'")[0]["n"] == 0


def test_sampling_stays_within_the_token_budget(tmp_path, logged):
    workdir(tmp_path, logged, CONFIG)
    out = judge_once(tmp_path, logged["engine"], env={"ONJOB_JUDGE__MAX_SAMPLE_TOKENS": "1"})
    assert "0 turn groups" in out and "3 over budget" in out, out


def test_an_engine_that_is_down_leaves_the_turns_for_the_next_pass(tmp_path, logged):
    db = workdir(tmp_path, logged, CONFIG)
    out = judge_once(tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    assert "cannot re-sample" in out and "wait for the next pass" in out, out
    assert rows(db, "SELECT count(*) AS n FROM groups WHERE kind = 'turn'")[0]["n"] == 0
    # Back up: the same turns are sampled.
    assert "3 turn groups" in judge_once(tmp_path, logged["engine"])


def test_a_turn_the_engine_refuses_is_marked_failed_not_retried_forever(tmp_path, logged):
    db = workdir(tmp_path, logged, CONFIG)
    store = Store(db)
    store.dicts(
        "UPDATE exchanges SET checkpoint = 'retired-adapter' WHERE id = ?", [logged["hello"]]
    )
    store.close()
    out = judge_once(tmp_path, logged["engine"])
    failed = rows(db, "SELECT * FROM groups WHERE prefix_exchange = ?", [logged["hello"]])
    assert len(failed) == 1 and failed[0]["status"] == "failed", out
    assert "the engine answered 404" in failed[0]["reason"]
    assert "2 turn groups" in out and "1 failed" in out


def test_serve_runs_the_judge_by_itself_every_interval(tmp_path, tool_engine):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    db = tmp_path / "onjob.duckdb"
    env = {
        "PYTHONPATH": str(tmp_path),
        "ONJOB_LOOP__INTERVAL_S": "0.5",
        "ONJOB_LOOP__TRAIN": "false",
        "ONJOB_JUDGE__GROUP_SIZE": "2",
        "ONJOB_JUDGE__REWARDS": '{"tool": {"fn": "my_rewards:calls_weather"}}',
    }
    with ServerProcess(["--engine-url", tool_engine.url, "--db", str(db)], env=env) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        client.chat.completions.create(
            model="agent", messages=TOOL_QUESTION, tools=TOOLS, max_tokens=24
        )
        deadline = time.monotonic() + 120
        while "judge pass: 1 turn groups" not in server.output():
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
    groups = rows(db, "SELECT * FROM groups")
    assert len(groups) == 1 and groups[0]["status"] == "scored"
    assert rows(db, "SELECT count(*) AS n FROM scores WHERE source = 'fn:tool'")[0]["n"] == 3
