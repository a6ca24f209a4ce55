"""`onjob compare` on two checkpoints built to differ in a known direction: the tool model
(taught to call get_weather) against an adapter that scrambles it, judged by a reward
function, through the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from onjob.collector import Store
from onjob.deploy.act import registry

from .conftest import TOOL_QUESTION, TOOLS, make_adapter, rows

ONJOB = str(Path(sys.executable).with_name("onjob"))


def test_compare_names_the_better_checkpoint_with_an_interval_that_excludes_a_coin_flip(
    tmp_path, tool_engine, tool_model_dir
):
    harmful = make_adapter(
        tool_model_dir, tmp_path / "harmful", seed=3, r=8, targets=["q_proj", "v_proj", "o_proj"]
    )
    store = Store(tmp_path / "onjob.duckdb")
    registry.add(store, harmful, "harmful", tool_model_dir)
    store.close()
    request = {"messages": TOOL_QUESTION, "tools": TOOLS, "max_tokens": 24}
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(request) for _ in range(12)))
    (tmp_path / "my_rewards.py").write_text(
        "def tool(r):\n    return any(c['function']['name'] == 'get_weather' "
        "for c in r.tool_calls)\n"
    )
    (tmp_path / "onjob.toml").write_text(
        '[judge]\ntemperature = 0\n[judge.rewards]\ntool = { fn = "my_rewards:tool" }\n'
    )
    cmd = [ONJOB, "compare", "--file", "prompts.jsonl", "--engine-url", tool_engine.url]
    try:
        done = subprocess.run(
            [*cmd, "harmful", "base", "--json"], cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        overall = result["overall"]
        assert overall["pairs"] == 12 and overall["wins"] == 12, result
        assert overall["ci95"][0] > 0.5  # base beats the scrambled adapter, clearly
        assert list(result["scenarios"]) == ["file:prompts.jsonl"]

        done = subprocess.run(
            [*cmd, "base", "harmful"], cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        overall_line = next(line for line in done.stdout.splitlines() if line.startswith("overall"))
        assert overall_line.split()[1:5] == ["12", "0", "0", "12"]  # pairs, B wins, ties, A wins
        assert "0.00 [0.00, 0.24]" in overall_line
    finally:
        httpx.post(
            f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": "harmful"}, timeout=60
        )
    # The pairs are `ab` groups, judged together; live routing and training never see them.
    groups = rows(tmp_path / "onjob.duckdb", "SELECT kind, status, checkpoints FROM groups")
    assert len(groups) == 24 and {(g["kind"], g["status"]) for g in groups} == {("ab", "scored")}
