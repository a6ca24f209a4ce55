"""The example agents are ordinary `openai` programs: run unchanged against onjob, their
traffic lands in DuckDB, and their reward functions score what they should."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from examples.arithmetic import task
from examples.calculator import task as task_calc
from examples.calculator.agent import solve
from onjob.cli.process import EngineProcess, ServerProcess
from onjob.judge import Rollout

from .conftest import rows, teach

ROOT = Path(__file__).resolve().parents[1]


def test_the_arithmetic_split_and_reward_are_sound():
    assert len(task.TRAIN) == 56 and len(task.HELDOUT) == 25
    assert not set(task.TRAIN) & set(task.HELDOUT)

    def rollout(answer: str) -> Rollout:
        q = {"role": "user", "content": "What is 4 + 8?"}
        return Rollout("m", [q, {"role": "assistant", "content": answer}])

    # Graded: the sum alone 1, the sum among other numbers (a hedge) 0.5, else 0; the
    # referee passes the top grade only.
    assert task.reward(rollout("4 + 8 = 12.")) == 1.0
    assert task.reward(rollout("The answer is 12")) == 1.0
    assert task.reward(rollout("It is 12, or maybe 13.")) == 0.5
    assert task.reward(rollout("4 + 8 = 120")) == 0.0
    assert task.reward(rollout("It is 11.")) == 0.0
    for answer in ("4 + 8 = 12.", "It is 12, or maybe 13.", "It is 11."):
        assert task.referee(rollout(answer)) == (task.reward(rollout(answer)) == 1.0)


def test_the_arithmetic_agent_runs_unchanged_through_onjob(tmp_path, engine):
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine.url, "--db", str(db)]
    with ServerProcess(args, env={"ONJOB_LOOP__INTERVAL_S": "0"}) as server:
        agent = [sys.executable, str(ROOT / "examples/arithmetic/agent.py")]
        done = subprocess.run(
            [*agent, "--base-url", server.url, "--questions", "10"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    assert "10 questions" in done.stdout
    logged = rows(db, "SELECT request FROM exchanges_full WHERE status = 200")
    assert len(logged) == 10 and all("What is" in r["request"] for r in logged)


def test_the_calculator_split_reward_and_tool_are_sound():
    assert len(task_calc.HELDOUT) == 30 and not set(task_calc.TRAIN) & set(task_calc.HELDOUT)
    q = "What is 12 × 13?"
    asked = {"role": "user", "content": q}
    call = {"id": "c1", "type": "function", "function": {"name": "multiply"}}
    call["function"]["arguments"] = '{"a": 13, "b": 12}'
    wrong = {**call, "function": {"name": "multiply", "arguments": '{"a": 12, "b": 31}'}}
    wrong_message = {"content": None, "tool_calls": [wrong]}

    def reward(message: dict) -> float:
        return task_calc.reward(Rollout("m", [asked, {"role": "assistant", **message}]))

    # Each step on the step it takes: a right call is as good as a right answer.
    assert reward({"content": "12 × 13 = 156."}) == 1.0
    assert reward({"content": None, "tool_calls": [call]}) == 1.0
    assert reward({"content": None, "tool_calls": [wrong]}) == 0.0
    assert reward({"content": None, "tool_calls": [call, wrong]}) == 0.5
    assert reward({"content": "It is 1560"}) == 0.0
    called = [asked, {"role": "assistant", "content": None, "tool_calls": [call]}]
    known = [*called, {"role": "tool", "tool_call_id": "c1", "content": "156"}]
    again = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert task_calc.reward(Rollout("m", [*known, again])) == 0.0  # no progress
    assert task_calc.reward(Rollout("m", [*known, {"role": "assistant", "content": "156"}])) == 1
    # A whole conversation that ends on a call was never answered.
    assert task_calc.reward(Rollout("m", called, kind="trajectory")) == 0.0
    assert task_calc.referee(Rollout("m", called)) is True
    assert task_calc.referee(Rollout("m", [asked, {"role": "assistant", **wrong_message}])) is False
    assert task_calc.multiply('{"a": 12, "b": 13}') == "156"
    assert task_calc.multiply('{"a": "x"}').startswith("error:")


@pytest.fixture(scope="module")
def calculator_engine(tmp_path_factory, tokenizer):
    """A tiny model taught the calculator's two turns for one question: call multiply, then
    answer with the tool's result."""
    q = task_calc.TRAIN[0]
    a, b = task_calc.operands(q)
    arguments = {"a": a, "b": b}
    call = {
        "id": "call-1",
        "type": "function",
        "function": {"name": "multiply", "arguments": json.dumps(arguments)},
    }
    first = task_calc.messages(q)
    second = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": str(a * b)},
    ]
    tool_call = json.dumps({"name": "multiply", "arguments": arguments})
    lessons = [
        (first, task_calc.TOOLS, f"<tool_call>\n{tool_call}\n</tool_call>"),
        (second, task_calc.TOOLS, f"{a} × {b} = {a * b}."),
    ]
    model = teach(tokenizer, lessons, tmp_path_factory.mktemp("calculator-model"))
    with EngineProcess(["--model", str(model), "--threads", "1"]) as proc:
        yield proc, q


def test_the_calculator_agent_runs_its_tool_and_onjob_stitches_the_turns(
    tmp_path, calculator_engine
):
    engine, q = calculator_engine
    db = tmp_path / "onjob.duckdb"
    args = ["--engine-url", engine.url, "--db", str(db)]
    with ServerProcess(args, env={"ONJOB_LOOP__INTERVAL_S": "0"}) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        answer, turns, calls, right_first = solve(client, "agent", q, temperature=0)
    assert (turns, calls, right_first) == (2, 1, True)
    assert task_calc.correct(q, answer), answer
    logged = rows(
        db, "SELECT trajectory_id, turn, request, response FROM exchanges_full ORDER BY turn"
    )
    assert [r["turn"] for r in logged] == [0, 1]
    assert logged[0]["trajectory_id"] == logged[1]["trajectory_id"]  # one conversation
    assert '"role":"tool"' in logged[1]["request"].replace(" ", "")
    assert "multiply" in logged[0]["response"]
