"""The example agents are ordinary `openai` programs: run unchanged against onjob, their
traffic lands in DuckDB, and their reward functions score what they should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from examples.arithmetic import task
from onjob.deploy.process import ServerProcess
from onjob.judge import Rollout

from .conftest import rows

ROOT = Path(__file__).resolve().parents[1]


def test_the_arithmetic_split_and_reward_are_sound():
    assert len(task.TRAIN) == 56 and len(task.HELDOUT) == 25
    assert not set(task.TRAIN) & set(task.HELDOUT)

    def rollout(answer: str) -> Rollout:
        q = {"role": "user", "content": "What is 4 + 8?"}
        return Rollout("m", [q, {"role": "assistant", "content": answer}])

    assert task.reward(rollout("4 + 8 = 12."))
    assert task.reward(rollout("The answer is 12"))
    assert not task.reward(rollout("4 + 8 = 120"))
    assert not task.reward(rollout("It is 11."))


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
    logged = rows(db, "SELECT request FROM exchanges WHERE status = 200")
    assert len(logged) == 10 and all("What is" in r["request"] for r in logged)
