"""Shared fixtures: tiny models with the real SmolLM2 tokenizer, and real engine processes.

The tiny models are randomly initialised Llamas (a few million parameters) built
from the bundled model's config family, so engine tests run in seconds while the
tokenizer and chat template are the real ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import msgspec
import pytest
import torch

from onjob import bundled
from onjob.cli import admin_key
from onjob.cli.process import EngineProcess
from onjob.collector import ExchangeRecord, Store
from onjob.collector.records import encode
from onjob.deploy.act.runs import record as record_run
from onjob.trainer.manifest import Manifest, Metrics

# A server a test starts runs its loop at the old default's pace (every 300 s: never
# within a test) unless the test sets its own `ONJOB_LOOP__INTERVAL_S`: at production's
# 30 s, a slow test's server would re-sample its logged turns, adding requests to a
# scripted upstream and rows to the tables the test counts. The loop is tested where set.
os.environ.setdefault("ONJOB_LOOP__INTERVAL_S", "300")

from .s3_server import s3_endpoint  # noqa: F401  (a fixture: vllm_engine's bucket)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_ANSWER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def rows(db, sql: str, params=None) -> list[dict]:
    """Read a DuckDB file no server holds."""
    store = Store(db)
    try:
        return store.dicts(sql, params)
    finally:
        store.close()


def admin_of(where) -> dict:
    """The header of the admin key `onjob serve` made beside its database (none was
    configured): `where` is the database's path, or the `ServerProcess` (its `--db`)."""
    args = getattr(where, "args", None)
    db = Path(args[args.index("--db") + 1] if args is not None else where)
    key = admin_key.read(db)
    assert key, f"no admin key beside {db}"
    return {"Authorization": f"Bearer {key}"}


def record_trained(
    store: Store,
    name: str,
    path: Path,
    base_model,
    *,
    groups: list[str] | tuple[str, ...] = (),
    config: dict | None = None,
    metrics: dict | None = None,
    parent: str | None = None,
) -> None:
    """A candidate as a finished training run records it (`record_run`, run `run-<name>`),
    from a manifest holding only what its rows keep; `metrics` beside no steps and a
    duration of 1 s."""
    manifest = Manifest(
        name=name,
        base_model=str(base_model),
        snapshot_sha256="",
        config_sha256="",
        config=config or {},
        groups=list(groups),
        metrics=msgspec.convert({"steps": 0, "duration_s": 1.0, **(metrics or {})}, Metrics),
        history=[],
        created=0.0,
    )
    record_run(store, f"run-{name}", manifest, Path(path), parent)


@pytest.fixture(scope="session")
def bundled_dir() -> Path:
    return bundled.prepare()


@pytest.fixture(scope="session")
def tokenizer(bundled_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_dir)


def _tiny_model(seed: int = 0, *, heads: int = 4):
    """`heads` 4: head_dim 16; 1: head_dim 64, the smallest vLLM's CPU attention takes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tiny-model")
    _tiny_model().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_vllm_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny model vLLM's CPU build can serve (head_dim 64)."""
    path = tmp_path_factory.mktemp("tiny-vllm-model")
    _tiny_model(heads=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_adapter(
    model_dir: Path, out: Path, *, seed: int, r: int, targets: list[str], std: float = 0.5
) -> Path:
    """A LoRA adapter with random non-zero weights: it really changes the model's outputs
    (with the default `std`, enough to scramble a tiny model; a small one barely moves it)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=std)
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_adapter_dir(tmp_path_factory, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("tiny-adapter")
    return make_adapter(tiny_model_dir, out, seed=1, r=8, targets=["q_proj", "v_proj", "o_proj"])


def teach(tokenizer, lessons: list[tuple[list[dict], list[dict] | None, str]], out: Path, seed=2):
    """A tiny model overfitted to answer each (messages, tools) with its text, saved with the
    tokenizer in `out`: a stand-in for a model that has learnt a behaviour."""
    import msgspec

    from onjob.engine import chat
    from onjob.protocol.chat import Message
    from onjob.protocol.fields import Tool

    batch = []
    for messages, tools, answer in lessons:
        prompt = chat.render(
            tokenizer,
            msgspec.convert(messages, list[Message]),
            msgspec.convert(tools, list[Tool]) if tools else None,
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt_ids + answer_ids])
        labels = ids.clone()
        labels[0, : len(prompt_ids)] = -100
        batch.append((ids, labels))
    model = _tiny_model(seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(400):
        loss = sum(model(input_ids=ids, labels=labels).loss for ids, labels in batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01 * len(batch):
            break
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "onjob-test.json").write_text(json.dumps({"final_loss": loss.item()}))
    return out


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny model taught (by overfitting) to answer TOOL_QUESTION with TOOL_ANSWER."""
    out = tmp_path_factory.mktemp("tool-model")
    return teach(tokenizer, [(TOOL_QUESTION, TOOLS, TOOL_ANSWER)], out)


@pytest.fixture
def adapter_loaded(engine, tiny_adapter_dir):
    """The tiny adapter loaded into the session's engine as `canary-a` (a canary's
    checkpoint), unloaded after the test."""
    import httpx

    body = {"lora_name": "canary-a", "lora_path": str(tiny_adapter_dir)}
    assert httpx.post(f"{engine.url}/load_lora_adapter", json=body, timeout=60).status_code == 200
    yield "canary-a"
    httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": "canary-a"}, timeout=60)


@pytest.fixture(scope="session")
def engine(tiny_model_dir):
    """A real local engine process serving the tiny model, as `tiny`."""
    with EngineProcess(
        ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--threads", "1"]
    ) as proc:
        yield proc


# The bundled model served small by either engine: a 2,048-token context, a 1 GiB KV cache
# on vLLM's CPU build, adapters up to rank 8 (the local engine takes and ignores the last
# two).
SMALL = [
    "--served-model-name",
    "smol",
    "--max-model-len",
    "2048",
    "--max-lora-rank",
    "8",
    "--cpu-kv-cache-gib",
    "1",
]


def vllm_args(model) -> list[str]:
    """`onjob engine` flags for real vLLM serving `model` as `smol` (`SMALL`)."""
    return ["--backend", "vllm", "--model", str(model), *SMALL]


REAL_ENGINE_ADAPTERS = 2  # `real_engine`'s --max-cpu-loras


@pytest.fixture(scope="session", params=["vllm", "local"])
def real_engine(request, bundled_dir, tmp_path_factory, s3_endpoint):  # noqa: F811
    """Each engine in turn, as `onjob engine` starts it, serving the bundled model as
    `smol`: real vLLM (its CPU build here: `make vllm`), then the local engine, held to the
    same tests. Adapters by name on: from `adapter_cache` (a directory of the session's),
    filled from `adapter_bucket` (a bucket on a real S3 API server); in vLLM by its
    filesystem resolver and onjob's plugin. `backend` says which. It holds
    `REAL_ENGINE_ADAPTERS` adapters' weights at once."""
    import boto3

    cache = tmp_path_factory.mktemp(f"{request.param}-adapters")
    bucket = f"{request.param}-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    checkpoints = f"s3://{bucket}/onjob/checkpoints"
    args = (
        vllm_args(bundled_dir) if request.param == "vllm" else ["--model", str(bundled_dir), *SMALL]
    )
    args += ["--adapter-cache-dir", str(cache), "--adapter-bucket", checkpoints]
    # Room for two adapters: a test that serves three sees each taken out and loaded again.
    args += ["--max-loras", "2", "--max-cpu-loras", str(REAL_ENGINE_ADAPTERS)]
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    with EngineProcess(args, env=env, timeout=600) as proc:
        proc.backend = request.param
        proc.adapter_cache, proc.adapter_bucket, proc.s3 = cache, checkpoints, s3_endpoint
        yield proc


@pytest.fixture(scope="session")
def tool_engine(tool_model_dir):
    """The tiny model taught to call get_weather, served as `toolbot`."""
    args = ["--model", str(tool_model_dir), "--served-model-name", "toolbot", "--threads", "1"]
    with EngineProcess(args) as proc:
        yield proc


@pytest.fixture(scope="session")
def client(engine):
    from openai import OpenAI

    return OpenAI(base_url=engine.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def fake_engine_url():
    """`onjob.testing.fake_upstream` as a real process (canned answers, no model): the engine
    behind servers whose tests are about the proxy and the database, not the model."""
    import subprocess
    import sys
    import time

    import httpx

    from onjob.cli.process import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "onjob.testing.fake_upstream", "--port", str(port)]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while True:  # ready when it answers
        try:
            httpx.get(f"{url}/models", timeout=1)
            break
        except httpx.TransportError:
            assert proc.poll() is None and time.monotonic() < deadline, "fake engine did not start"
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait()


def debian_program(path: str, package: str) -> str:
    """The program at `path`, its Debian package installed here if it is missing (a fresh
    CI machine runs as root with apt-get)."""
    if not Path(path).exists():
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.fail(f"{path} is missing: install Debian's {package} package")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
            check=True, env=env, timeout=1200,
        )  # fmt: skip
    return path


def placed_line(
    eid: str, parent: str | None, turn: int, *, trajectory: str, content: str, kept: int
) -> bytes:
    """A spool line placed already, one user message, stored against `parent` (keeping
    `kept` of its messages and prompt ids) when there is one."""
    request = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return encode(
        ExchangeRecord(
            id=eid,
            ts=float(turn),
            trajectory_id=trajectory,
            turn=turn,
            scenario_id="s",
            scenario_key="k",
            scenario_keyed="derived",
            request=msgspec.Raw(msgspec.json.encode(request)),
            prompt_token_ids=[turn],
            parent_id=parent,
            messages_kept=kept if parent else None,
            prompt_kept=kept if parent else None,
        )
    )
