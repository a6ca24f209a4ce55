"""Checkpoints that reach every replica through object storage, and training as a job.

Real parts: a moto S3 server process, `onjob train` with `trainer.runner = "job"` on a
real database, `onjob train --jobs` as the training job, and local engine processes
started after the checkpoint was published, which load it by name on its first request
(vLLM's LoRA resolver contract) instead of answering 404.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from onjob import published
from onjob.bucket import Bucket
from onjob.cli.process import EngineProcess, ServerProcess
from onjob.collector import Store
from onjob.deploy.act import registry
from onjob.trainer import TrainSettings, jobs

from .conftest import admin_of, rows
from .s3_server import bucket_url, s3_endpoint  # noqa: F401  (fixtures)
from .test_engine_restart import adapters_in, ask, make_live
from .test_trainer_ranks import four_groups  # noqa: F401  (a fixture)
from .test_trainer_rules import Db

ONJOB = str(Path(sys.executable).with_name("onjob"))
QUESTION = [{"role": "user", "content": "Say yes."}]


def _replica(model: Path, cache: Path, bucket: str, endpoint: str) -> EngineProcess:
    """A local engine with the adapter resolver on: this host's cache, the bucket's
    checkpoints."""
    args = ["--model", str(model), "--served-model-name", "tiny", "--threads", "1"]
    args += ["--adapter-cache-dir", str(cache), "--adapter-bucket", bucket]
    return EngineProcess(args, env={"AWS_ENDPOINT_URL": endpoint})


def checkpoint_name(out: str) -> str:
    return out.split("recorded as a candidate")[0].rsplit("checkpoint ", 1)[1].strip()


def _scored_groups(db_path: Path) -> None:
    """A database holding two scored groups with a spread of rewards, as the judge leaves
    them (the logged logprobs are made up: the run below lets any gap through)."""
    db = Db(db_path)
    try:
        for i, prompt in enumerate(([1, 2, 3], [4, 5, 6])):
            db.exchange(f"a{i}", f"ta{i}", 1, prompt, [10, 11])
            db.exchange(f"b{i}", f"tb{i}", 1, prompt, [12])
            db.group(f"g{i}", "trajectory", [(f"a{i}", f"ta{i}", 1.0, "production"),
                                              (f"b{i}", f"tb{i}", 0.0, "production")])  # fmt: skip
    finally:
        db.store.close()


def test_a_run_handed_to_a_job_is_served_by_a_replica_started_after_it(
    tmp_path,
    engine,
    tiny_model_dir,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    db = tmp_path / "onjob.duckdb"
    _scored_groups(db)
    # The engines that serve the adapter are started with this path to the model, not the
    # trainer's: the trainer writes it as the adapter's base, which resolvers compare.
    served_base = tmp_path / "served-base"
    served_base.symlink_to(tiny_model_dir)
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": s3_endpoint,
        "ONJOB_TRAINER__BASE_MODEL": str(tiny_model_dir),
        "ONJOB_TRAINER__LEARNING_RATE": "0.01",
        "ONJOB_TRAINER__MAX_LOGPROB_GAP": "100",
        "ONJOB_TRAINER__KL_OWN_PROMPTS": "0",
        "ONJOB_TRAINER__RUNNER": "job",
        "ONJOB_TRAINER__BUCKET": bucket_url,
        "ONJOB_TRAINER__SERVED_BASE": str(served_base),
    }
    # The server's side submits the snapshot and waits; the job, another process that
    # shares nothing with it but the bucket, takes it, trains and publishes.
    server = subprocess.Popen(
        [ONJOB, "train", "--db", str(db)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    elsewhere = tmp_path / "job-host"
    elsewhere.mkdir()
    job = subprocess.Popen(
        [ONJOB, "train", "--jobs", bucket_url, "--once", "--poll-s", "0.2"],
        cwd=elsewhere,
        env={k: v for k, v in env.items() if not k.startswith("ONJOB_TRAINER__")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out = server.communicate(timeout=600)[0].decode()
        assert server.returncode == 0, out
        job_out = job.communicate(timeout=60)[0].decode()
        assert job.returncode == 0, job_out
    finally:
        for proc in (server, job):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert f"training job {checkpoint_name(out)}" in job_out
    assert "submitted to" in out and "recorded as a candidate" in out
    [checkpoint] = rows(db, "SELECT * FROM checkpoints")
    name, path = checkpoint["name"], Path(checkpoint["path"])
    assert checkpoint["status"] == "candidate"
    assert (path / "adapter_model.safetensors").is_file()
    assert json.loads((path / "onjob-manifest.json").read_text())["name"] == name
    assert json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        str(served_base)
    )
    checkpoints = f"{bucket_url}/checkpoints"
    assert published.published(Bucket.from_url(checkpoints, endpoint_url=s3_endpoint), name)
    # The bucket keeps no copy of the groups once the server has the checkpoint (its own
    # snapshot, beside its checkpoints, is where `onjob forget` looks).
    left = Bucket.from_url(f"{bucket_url}/snapshots", endpoint_url=s3_endpoint).list(f"{name}/")
    assert sorted(o.key for o in left) == [f"{name}/job.json", f"{name}/taken"]

    # A replica started now, which never heard of the checkpoint. Started on the trainer's
    # path, not the adapter's base, it refuses the adapter (vLLM's resolver checks the same),
    # as it does names that are no checkpoint or would leave its cache.
    with _replica(tiny_model_dir, tmp_path / "cache-a", checkpoints, s3_endpoint) as replica:
        client = OpenAI(base_url=replica.url, api_key="unused", max_retries=0, timeout=120)
        for model in (name, "ckpt-none", "../served-base", "/etc"):
            with pytest.raises(openai.NotFoundError):
                client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4)
    # On the adapter's base, it serves the checkpoint at its first request, as the trainer
    # wrote it: the same answer as an engine that had it loaded through the endpoint.
    with _replica(served_base, tmp_path / "cache-b", checkpoints, s3_endpoint) as replica:
        client = OpenAI(base_url=replica.url, api_key="unused", max_retries=0, timeout=120)
        ask = dict(messages=QUESTION, max_tokens=6, temperature=0, logprobs=True)
        first = client.chat.completions.create(model=name, **ask)
        assert first.model == name
        base = client.chat.completions.create(model="tiny", **ask)
        listed = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
        assert listed[name] == "tiny"
        assert (tmp_path / "cache-b" / name / "adapter_config.json").is_file()
        load = {"lora_name": name, "lora_path": str(path)}
        assert httpx.post(f"{engine.url}/load_lora_adapter", json=load, timeout=60).is_success
        try:
            loaded = OpenAI(base_url=engine.url, api_key="unused", max_retries=0)
            again = loaded.chat.completions.create(model=name, **ask)
        finally:
            httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)
        logprobs = [t.logprob for t in first.choices[0].logprobs.content]
        assert logprobs == pytest.approx([t.logprob for t in again.choices[0].logprobs.content])
        assert logprobs != [t.logprob for t in base.choices[0].logprobs.content]  # not the base


def test_a_replica_started_after_the_promotion_serves_the_live_checkpoint_at_once(
    tmp_path,
    tiny_model_dir,
    tiny_adapter_dir,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    """Engine B comes up after the promotion, on a host that cannot read the checkpoint's
    registered path: no operator can load it there, yet with engine A gone it answers the
    live alias's first request from the published checkpoint."""
    checkpoint = "ckpt-live"
    registered = tmp_path / "server-disk" / checkpoint
    shutil.copytree(tiny_adapter_dir, registered)
    checkpoints = f"{bucket_url}/checkpoints"
    bucket = Bucket.from_url(checkpoints, endpoint_url=s3_endpoint)
    assert published.publish(bucket, registered, checkpoint)
    assert not published.publish(bucket, registered, checkpoint)  # published once
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, registered, checkpoint, tiny_model_dir)
    store.close()

    a = _replica(tiny_model_dir, tmp_path / "cache-a", checkpoints, s3_endpoint).start()
    b = _replica(tiny_model_dir, tmp_path / "cache-b", checkpoints, s3_endpoint)
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_PROXY__ENGINE_URLS": json.dumps([a.url, b.url]),
        "ONJOB_PROXY__ENGINES_RESOLVE_ADAPTERS": "true",
        "ONJOB_PROXY__HEALTH_INTERVAL_S": "0.2",
    }
    try:
        with ServerProcess(["--db", str(db)], env=env) as server:
            make_live(server, checkpoint)
            client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
            assert ask(client, 0).http_response.status_code == 200  # A, loaded by path
            shutil.rmtree(registered)  # as on B's host: the path is not there
            b.start()
            a.kill()
            deadline = time.monotonic() + 30
            while (
                httpx.get(f"{server.base}/admin/status", headers=admin_of(server)).json()[
                    "engines"
                ][1]["state"]
                != "up"
            ):
                assert time.monotonic() < deadline, "B never came up"
                time.sleep(0.1)
            for i in range(1, 4):
                assert ask(client, i).http_response.status_code == 200
            assert checkpoint in adapters_in(b)
    finally:
        a.stop()
        b.stop()
    logged = rows(db, "SELECT status, served_model FROM exchanges ORDER BY ts")
    assert [(r["status"], r["served_model"]) for r in logged] == [(200, checkpoint)] * 4


def test_a_job_with_nothing_to_train_on_says_so_in_the_bucket(
    tmp_path,
    tiny_model_dir,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    """Every member of the group scored alike: the job exits 3, leaves `failed` with that
    exit and the reason, publishes nothing, and a second watcher finds nothing to take."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    snap = tmp_path / "s.parquet"
    members = [
        {"group_id": "flat", "kind": "turn", "member_id": f"m{i}", "position": i, "reward": 0.5,
         "checkpoint": None, "prompt_ids": [[1, 2, 3]], "completion_ids": [[10 + i]],
         "logprobs": [[-1.0]]}
        for i in range(3)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(members), snap)
    store = jobs.Store(
        Bucket.from_url(f"{bucket_url}/snapshots", endpoint_url=s3_endpoint),
        Bucket.from_url(f"{bucket_url}/checkpoints", endpoint_url=s3_endpoint),
    )
    jobs.submit(store, jobs.Job("ckpt-flat", None, TrainSettings(base_model=tiny_model_dir)), snap)
    assert (
        jobs.pending(store) == ["ckpt-flat"] and jobs.outcome(store, "ckpt-flat").state == "waiting"
    )
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_endpoint}
    cmd = [ONJOB, "train", "--snapshot", f"{bucket_url}/snapshots/ckpt-flat"]
    done = subprocess.run(
        [*cmd, "--publish", f"{bucket_url}/checkpoints"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    outcome = jobs.outcome(store, "ckpt-flat")
    assert (outcome.state, outcome.exit) == ("failed", 3)
    assert "1 groups with equal scores" in outcome.reason
    assert store.checkpoints.list() == [] and jobs.pending(store) == []


def test_a_job_trains_under_torchrun_with_two_ranks_and_publishes_once(
    tmp_path,
    tiny_model_dir,
    four_groups,  # noqa: F811
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    store = jobs.Store(
        Bucket.from_url(f"{bucket_url}/snapshots", endpoint_url=s3_endpoint),
        Bucket.from_url(f"{bucket_url}/checkpoints", endpoint_url=s3_endpoint),
    )
    settings = TrainSettings(base_model=tiny_model_dir, groups_per_step=2, kl_own_prompts=0)
    jobs.submit(store, jobs.Job("ckpt-ranks", None, settings), four_groups)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_endpoint, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [ONJOB, "train", "--jobs", bucket_url, "--once", "--ranks", "2", "--poll-s", "0.2"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert jobs.outcome(store, "ckpt-ranks").state == "published"
    got = published.fetch(store.checkpoints, "ckpt-ranks", tmp_path / "cache")
    metrics = json.loads((got / "onjob-manifest.json").read_text())["metrics"]
    assert metrics["ranks"] == 2 and metrics["ranks_weight_gap"] == 0.0
    assert metrics["steps"] == 2
