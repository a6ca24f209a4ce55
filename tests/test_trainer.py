"""The trainer on real parts: a tiny model with the real tokenizer and peft, Parquet
snapshots, the `onjob train` command, and the local engine loading what it wrote."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from openai import OpenAI

from onjob.cli.process import ServerProcess
from onjob.trainer import NothingToTrain, TrainSettings
from onjob.trainer.loop import train
from onjob.trainer.manifest import FILE as MANIFEST

from .conftest import TOOL_QUESTION, TOOLS, rows

ONJOB = str(Path(sys.executable).with_name("onjob"))


def completion_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return (
        torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1).tolist()
    )


def write_snapshot(
    path: Path, groups: list[tuple[str, list[int], list[list[int]], list[float]]], model
):
    """Groups as the snapshot export writes them, the sampler's logprobs from `model`."""
    records = []
    for group_id, prompt, completions, rewards in groups:
        for i, (completion, reward) in enumerate(zip(completions, rewards, strict=True)):
            records.append(
                {
                    "group_id": group_id,
                    "kind": "turn",
                    "member_id": f"{group_id}-m{i}",
                    "position": i,
                    "reward": reward,
                    "checkpoint": None,
                    "prompt_ids": [prompt],
                    "completion_ids": [completion],
                    "logprobs": [completion_logprobs(model, prompt, completion)],
                }
            )
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


@pytest.fixture(scope="module")
def toy(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say yes."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    answers = ["Yes.", "No.", "Maybe so.", "I cannot say."]
    completions = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    return model, prompt, completions


def test_a_few_steps_raise_the_best_members_logprob_and_lower_the_worsts(
    tmp_path, tiny_model_dir, toy
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, prompt, completions = toy
    rewards = [1.0, 0.0, 0.3, 0.1]
    snap = write_snapshot(tmp_path / "s.parquet", [("g1", prompt, completions, rewards)], model)
    settings = TrainSettings(
        base_model=tiny_model_dir, learning_rate=2e-3, epochs=6, lora_rank=8, seed=1
    )
    manifest = train(snap, tmp_path / "ckpt", settings, progress=False, echo=lambda _: None)
    assert manifest.steps == 6 and manifest.groups == ["g1"]
    assert (tmp_path / "ckpt" / "adapter_model.safetensors").exists()
    assert (tmp_path / "ckpt" / "adapter_config.json").exists()

    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "ckpt"
    )
    before = [sum(completion_logprobs(model, prompt, c)) for c in completions]
    after = [sum(completion_logprobs(tuned, prompt, c)) for c in completions]
    assert after[0] > before[0] + 0.1  # the best answer became likelier
    assert after[1] < before[1] - 0.1  # the worst less likely
    # The run measured how far it moved from the base model: k3 per sampled token weighted
    # by tuned / sampler (the base sampled this snapshot), capped at 5, the same figure an
    # unpacked forward through each model gives.
    tuned_lp = [lp for c in completions for lp in completion_logprobs(tuned, prompt, c)]
    base_lp = [lp for c in completions for lp in completion_logprobs(model, prompt, c)]
    k3 = [math.exp(b - p) - (b - p) - 1 for p, b in zip(tuned_lp, base_lp, strict=True)]
    w = [min(math.exp(p - b), 5.0) for p, b in zip(tuned_lp, base_lp, strict=True)]
    metrics = manifest.metrics
    assert metrics.kl_to_base_tokens == len(k3)
    weighted = sum(x * y for x, y in zip(w, k3, strict=True)) / sum(w)
    assert math.isclose(metrics.kl_to_base, weighted, rel_tol=1e-3)
    assert metrics.kl_to_base > 1e-3  # six steps at a high rate moved it
    # And on answers the tuned policy sampled itself: its own tokens, k3 >= 0 per token.
    assert 0 < metrics.kl_to_base_own_tokens <= 32
    assert math.isfinite(metrics.kl_to_base_own) and metrics.kl_to_base_own > 0


def test_groups_with_equal_scores_are_skipped_and_said(tmp_path, tiny_model_dir, toy):
    model, prompt, completions = toy
    snap = write_snapshot(
        tmp_path / "s.parquet", [("flat", prompt, completions[:3], [0.5, 0.5, 0.5])], model
    )
    lines = []
    with pytest.raises(NothingToTrain, match="1 groups with equal scores"):
        train(snap, tmp_path / "ckpt", TrainSettings(base_model=tiny_model_dir), echo=lines.append)
    assert any("all 3 members scored 0.50: nothing to learn" in line for line in lines)
    assert not (tmp_path / "ckpt").exists()
    # The child process says it too, with its own exit code.
    done = subprocess.run(
        [ONJOB, "train", "--snapshot", str(snap), "--out", str(tmp_path / "c2")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stderr
    assert "nothing to train on" in done.stderr


def test_groups_the_trainer_skips_every_member_of_are_not_exported_again(
    tmp_path, tool_engine, tool_model_dir
):
    db = judged(tmp_path, tool_engine, tool_model_dir)
    tight = {**os.environ, "ONJOB_TRAINER__MAX_TOKENS_PER_MEMBER": "64"}  # all too long
    skipped = subprocess.run(
        [ONJOB, "train"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=tight
    )
    assert skipped.returncode == 3, skipped.stdout + skipped.stderr
    [run] = rows(db, "SELECT * FROM train_runs")
    assert run["groups_used"] and json.loads(run["metrics"])["skipped"]
    assert rows(db, "SELECT count(*) AS n FROM checkpoints")[0]["n"] == 0
    # The next run does not hand the same groups to a child again.
    again = subprocess.run(
        [ONJOB, "train"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=tight
    )
    assert again.returncode == 3 and "nothing to train on" in again.stdout
    assert "training on" not in again.stdout + again.stderr


def test_a_group_sampled_under_another_logprob_definition_is_refused_and_said(
    tmp_path, tool_engine, tool_model_dir
):
    db = judged(tmp_path, tool_engine, tool_model_dir)
    # One group's re-samples as a vLLM run with --logprobs-mode processed_logprobs (and
    # proxy.engine_logprobs saying so) would have logged them.
    with duckdb.connect(str(db)) as con:
        (group,) = con.execute(
            "SELECT g.id FROM groups g JOIN scores s ON s.group_id = g.id "
            "WHERE g.status = 'scored' AND s.source = 'combined' "
            "GROUP BY g.id HAVING max(s.score) > min(s.score) ORDER BY g.id LIMIT 1"
        ).fetchone()
        con.execute(
            "UPDATE exchanges SET logprobs_mode = 'processed_logprobs' WHERE id IN "
            "(SELECT exchange_id FROM members WHERE group_id = ? AND origin = 'sampled')",
            [group],
        )
    trained = subprocess.run(
        [ONJOB, "train"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    said = trained.stdout + trained.stderr
    assert trained.returncode in (0, 3), said
    assert f"group {group}: logprobs recorded as processed_logprobs" in said
    # Refused once and recorded as such: no later run is handed it again.
    again = subprocess.run(
        [ONJOB, "train"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert group not in again.stdout + again.stderr


REWARDS = """
def calls_weather(rollout):
    return any(c["function"]["name"] == "get_weather" for c in rollout.tool_calls)
"""


def judged(tmp_path, tool_engine, tool_model_dir) -> Path:
    """A work directory with four logged tool questions judged into scored groups (four
    scenarios: the held-out slice, which the judge leaves alone, may take one of them)."""
    db = tmp_path / "onjob.duckdb"
    with ServerProcess(
        ["--engine-url", tool_engine.url, "--db", str(db)], env={"ONJOB_LOOP__INTERVAL_S": "0"}
    ) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        for city in ("Paris", "Rome", "Berlin", "Madrid"):
            question = f"What is the weather in {city}?"
            client.chat.completions.create(
                model="agent",
                messages=[{"role": "user", "content": question}],
                tools=TOOLS,
                max_tokens=24,
                # Greedy, the tiny model calls the tool: each group's logged answer earns 1,
                # and its re-sampled ones (temperature 1.5) mostly do not. A sampled logged
                # answer sometimes did not either, and no group had a spread to train on.
                temperature=0,
            )
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "onjob.toml").write_text(
        f"""
[judge]
group_size = 6
temperature = 1.5
scenario_groups = false

[judge.rewards]
tool = {{ fn = "my_rewards:calls_weather" }}

[trainer]
base_model = "{tool_model_dir}"
learning_rate = 0.005
epochs = 4
lora_rank = 8
"""
    )
    judge = subprocess.run(
        [ONJOB, "judge", "--once", "--engine-url", tool_engine.url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert judge.returncode == 0, judge.stderr
    return db


def test_traffic_to_judged_groups_to_a_checkpoint_the_engine_loads_and_serves(
    tmp_path, tool_engine, tool_model_dir
):
    db = judged(tmp_path, tool_engine, tool_model_dir)
    # Every exchange, logged or re-sampled, says how its logprobs were defined.
    logged = rows(db, "SELECT source, logprobs_mode FROM exchanges")
    assert {r["source"] for r in logged} == {"production", "resample"}
    assert {r["logprobs_mode"] for r in logged} == {"raw_logprobs"}
    trained = subprocess.run(
        [ONJOB, "train"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "recorded as a candidate" in trained.stdout

    checkpoint = rows(db, "SELECT * FROM checkpoints")
    assert len(checkpoint) == 1 and checkpoint[0]["status"] == "candidate"
    run = rows(db, "SELECT * FROM train_runs")[0]
    assert checkpoint[0]["train_run"] == run["id"] and run["groups_used"]
    assert json.loads(run["metrics"])["steps"] >= 1
    path = Path(checkpoint[0]["path"])
    written = json.loads((path / MANIFEST).read_text())
    assert written["base_model"] == str(tool_model_dir)
    assert written["parent"] is None and len(written["snapshot_sha256"]) == 64
    # Trained groups are not exported again.
    again = subprocess.run([ONJOB, "train"], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 3 and "nothing to train on" in again.stdout

    # The engine loads the checkpoint as it is, and it answers differently from the base.
    name = checkpoint[0]["name"]
    load = httpx.post(
        f"{tool_engine.url}/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path)},
        timeout=60,
    )
    assert load.status_code == 200, load.text
    try:
        engine = OpenAI(base_url=tool_engine.url, api_key="unused", max_retries=0)
        answers = {}
        for model in ("toolbot", name):
            r = engine.chat.completions.create(
                model=model,
                messages=TOOL_QUESTION,
                tools=TOOLS,
                max_tokens=12,
                temperature=0,
                logprobs=True,
            )
            answers[model] = [t.logprob for t in r.choices[0].logprobs.content]
        assert answers["toolbot"] != answers[name]
    finally:
        httpx.post(f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def test_a_supervised_warm_start_on_best_members_lowers_their_loss_first(
    tmp_path, tiny_model_dir, toy
):
    model, prompt, completions = toy
    snap = write_snapshot(
        tmp_path / "s.parquet", [("g1", prompt, completions, [0.0, 1.0, 0.2, 0.1])], model
    )
    lines = []
    settings = TrainSettings(
        base_model=tiny_model_dir, sft_epochs=5, sft_learning_rate=5e-3, lora_rank=8
    )
    train(snap, tmp_path / "ckpt", settings, progress=False, echo=lines.append)
    warm = next(line for line in lines if line.startswith("warm start"))
    first, last = (float(x) for x in warm.split("loss ")[1].split(" -> "))
    assert "on 1 best members" in warm and last < first - 0.1


def test_an_unmoved_policy_reads_no_kl_on_its_own_samples_of_prompts_of_any_length(
    tmp_path, tiny_model_dir, toy
):
    """The policy's own answers are sampled for all prompts at once, left-padded, and the
    base scores them right-padded: a row placed at the wrong positions on either side
    reads KL where there is none."""
    model, prompt, completions = toy
    groups = [
        (f"g{n}", [*prompt[:1], *prompt[1:2] * n, *prompt[1:]], completions, [1.0, 0.0, 0.3, 0.1])
        for n in (0, 5, 11)
    ]
    snap = write_snapshot(tmp_path / "snap.parquet", groups, model)
    settings = TrainSettings(
        base_model=str(tiny_model_dir),
        learning_rate=1e-12,  # AdamW moves each weight by about this: the base, to 1e-20
        groups_per_step=3,
        kl_own_prompts=3,
        threads=1,
    )
    metrics = train(snap, tmp_path / "ckpt", settings, progress=False, echo=lambda _: None).metrics
    assert metrics.kl_to_base_own_tokens > 32  # more than one prompt's answer
    assert metrics.kl_to_base_own < 1e-6
