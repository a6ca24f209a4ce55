"""The learning benchmark: the arithmetic agent's held-out success before and after the
whole loop, through the real path (agent -> onjob serve -> judge -> trainer -> canary ->
paired comparison -> promotion), on the bundled SmolLM2-135M.

    .venv/bin/python bench/learning.py [--budget-s 1200]

Starts `onjob serve --start-engine` in a fresh directory with the loop configured
for the demo task (reward `examples.arithmetic.task:reward`), measures the base
model on the 25 held-out questions (8 samples each, straight to the engine, not
logged), runs the agent's traffic through the proxy until the loop has promoted
checkpoints for `--budget-s`, measures the live checkpoint the same way, and
writes bench/results/learning-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.arithmetic import task  # noqa: E402
from examples.arithmetic.evaluate import evaluate  # noqa: E402
from onjob import bundled  # noqa: E402
from onjob.deploy.process import ServerProcess, free_port  # noqa: E402

CONFIG = """
[proxy]
admin_key = "bench"

[judge]
group_size = 8
temperature = 1.0
max_tokens = 48
max_groups = 16
per_scenario = 1
scenario_groups = false
concurrency = 2

[judge.rewards]
correct = {{ fn = "examples.arithmetic.task:reward" }}

[trainer]
learning_rate = 0.0002
groups_per_step = 4
max_groups = 16
threads = 1
checkpoints_dir = "{dir}/checkpoints"

[loop]
interval_s = 5
min_new_groups = 8
canary_fraction = 0.5
pairs_per_round = 8
min_pairs = 8
max_pairs = 64
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=1200)
    args = parser.parse_args()
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="onjob-learning-"))
    (work / "onjob.toml").write_text(CONFIG.format(dir=work))
    engine_url = f"http://127.0.0.1:{free_port()}/v1"
    env = {"PYTHONPATH": str(ROOT), "ONJOB_ENGINE__ARGS": json.dumps(["--threads", "2"])}
    server_args = ["--config", str(work / "onjob.toml"), "--db", str(work / "onjob.duckdb")]
    server_args += ["--start-engine", "--engine-url", engine_url]
    with ServerProcess(server_args, env=env, timeout=900) as server:
        before = evaluate(engine_url, bundled.MODEL_NAME)
        print(f"base model: held-out success {before['success']:.1%} {before['ci95']}", flush=True)
        stop = threading.Event()
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=2, timeout=600)

        def agent() -> None:
            seed = 0
            while not stop.is_set():
                seed += 1
                for q in task.training_questions(8, seed):
                    if stop.is_set():
                        return
                    client.chat.completions.create(
                        model="agent", messages=task.messages(q), max_tokens=48, temperature=1.0
                    )

        traffic = threading.Thread(target=agent, daemon=True)
        traffic.start()
        admin = {"Authorization": "Bearer bench"}
        promotions, printed = 0, set()
        deadline = started + args.budget_s
        while time.time() < deadline:
            time.sleep(5)
            for line in server.output().splitlines():  # the server's last few KB of log
                if ("onjob.loop" in line or "onjob.deploy" in line) and line not in printed:
                    printed.add(line)
                    print(f"[{time.time() - started:5.0f} s] {line.split(': ', 1)[-1]}", flush=True)
            status = httpx.get(f"{server.base}/admin/status", headers=admin).json()
            promotions = sum(
                1 for d in status["deployments"] if d["actor"] == "loop" and not d["canary"]
            )
        stop.set()
        live = status["aliases"]["agent"]["live"]
        after = evaluate(engine_url, live or bundled.MODEL_NAME)
        print(f"live {live or 'base'}: held-out success {after['success']:.1%} {after['ci95']}")
        runs = len(list((work / "checkpoints").glob("ckpt-*")))
    result = {
        "bench": "learning",
        "task": "examples/arithmetic (one-digit sums), reward: right sum in the answer",
        "before": before,
        "after": {**after, "checkpoint": live},
        "wall_s": time.time() - started,
        "train_runs": runs,
        "promotions": promotions,
        "machine": {"cpus": os.cpu_count()},
    }
    out = ROOT / "bench" / "results" / f"learning-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
