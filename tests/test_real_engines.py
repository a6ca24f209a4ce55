"""onjob on real engines serving the bundled SmolLM2-135M-Instruct, each started as a
user starts it: vLLM's CPU build (`make vllm`, `onjob engine install vllm`; `onjob engine
--backend vllm`), then the local engine, held to the same tests (the `real_engine`
fixture: one of each for the session, vLLM ~1 minute to start). The lifecycle and restart
tests start vLLMs of their own.

What is checked on vLLM itself, not on a copy of its contract, and on the local engine
alike: token ids and logprobs, whole and streamed, equal to the trainer's forward pass; a
checkpoint of onjob's trainer hot-loaded, served and unloaded; the prompt rendered with
tools equal to the local engine's; adapters by name from the cache and the bucket; tool
calls and structured outputs through the proxy, logged and marked as they must be; the
Responses path; `onjob serve --start-engine --backend vllm` and a vLLM restart with the
live checkpoint restored.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time

import httpx
import jsonschema
import msgspec
import pytest
import torch
from openai import OpenAI

from onjob.cli.process import EngineProcess, ServerProcess, free_port, port_taken
from onjob.collector import Store
from onjob.deploy.act import registry
from onjob.engine import chat
from onjob.judge.admission import waiting
from onjob.judge.sampling import BACKGROUND
from onjob.protocol.chat import Message
from onjob.protocol.fields import Tool

from .conftest import REAL_ENGINE_ADAPTERS, SMALL, TOOLS, admin_of, make_adapter, rows, vllm_args
from .test_engine_restart import adapters_in, make_live

QUESTION = [{"role": "user", "content": "What is 12 + 30? Answer with the number."}]
ADAPTER = "ckpt-smol"


@pytest.fixture(scope="module")
def smol_model(bundled_dir):
    """The bundled model as the trainer loads it: float32 on CPU."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(bundled_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def smol_adapter(tmp_path_factory, bundled_dir):
    """A LoRA checkpoint on SmolLM2 as the trainer writes one (peft, rank 8), with weights
    large enough to change its greedy answers."""
    out = tmp_path_factory.mktemp("smol-adapter")
    return make_adapter(bundled_dir, out, seed=3, r=8, targets=["q_proj", "v_proj"], std=0.2)


def trainer_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """What the trainer computes for the sampled tokens (`trainer/forward.py`)."""
    from onjob.trainer.data import Sequence
    from onjob.trainer.forward import Head, sampled_logprobs

    member = Sequence(
        "m",
        prompt + completion,
        [False] * len(prompt) + [True] * len(completion),
        [0.0] * (len(prompt) + len(completion)),
        0.0,
        0.0,
    )
    with torch.no_grad():
        return sampled_logprobs(model, Head.of(model), [member], "cpu").tolist()


def chat_body(**extra) -> dict:
    return {
        "model": "smol",
        "messages": QUESTION,
        "max_tokens": 24,
        "logprobs": True,
        "return_token_ids": True,
        "seed": 7,
        **extra,
    }


def complete(engine, **extra) -> httpx.Response:
    """A chat completion straight from `engine`: `chat_body` with `extra` over it."""
    return httpx.post(f"{engine.url}/chat/completions", json=chat_body(**extra), timeout=120)


def streamed(url: str, body: dict) -> tuple[list[int], list[int], list[float], str]:
    """A streamed answer's prompt ids, completion ids, logprobs and text, chunk by chunk."""
    prompt, ids, logprobs, text = [], [], [], ""
    with httpx.stream("POST", f"{url}/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            prompt += event.get("prompt_token_ids") or []
            for choice in event["choices"]:
                ids += choice.get("token_ids") or []
                logprobs += [
                    t["logprob"] for t in (choice.get("logprobs") or {}).get("content", [])
                ]
                text += choice["delta"].get("content") or ""
    return prompt, ids, logprobs, text


def test_token_ids_and_logprobs_whole_and_streamed_equal_the_trainers_forward(
    real_engine, smol_model
):
    body = complete(real_engine)
    assert body.status_code == 200, body.text
    answer = body.json()
    choice = answer["choices"][0]
    ids = choice["token_ids"]
    logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert len(ids) == len(logprobs) == answer["usage"]["completion_tokens"] > 0
    mine = trainer_logprobs(smol_model, answer["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(logprobs, mine, strict=True)) < 2e-3

    prompt, ids, logprobs, text = streamed(real_engine.url, chat_body(max_tokens=16))
    assert prompt == answer["prompt_token_ids"] and len(ids) == len(logprobs) > 0
    assert text
    mine = trainer_logprobs(smol_model, prompt, ids)
    assert max(abs(a - b) for a, b in zip(logprobs, mine, strict=True)) < 2e-3


def test_both_engines_serve_background_work_as_users_and_state_their_queue(real_engine):
    # vLLM refuses any priority unless started with `--scheduling-policy priority`, as
    # `onjob engine --backend vllm` starts it: the judge's background samples must pass.
    user = complete(real_engine)
    background = complete(real_engine, priority=BACKGROUND)
    assert background.status_code == 200, background.text
    assert background.json()["choices"][0]["token_ids"] == user.json()["choices"][0]["token_ids"]

    async def queued():
        async with httpx.AsyncClient(base_url=real_engine.url) as engine:
            return await waiting(engine)

    assert asyncio.run(queued()) == 0  # the admission's reading, the same on both


def test_a_request_with_tools_renders_as_the_local_engine_renders_it(real_engine, tokenizer):
    """SmolLM2's template ignores `tools`; onjob gives vLLM its own preamble, so the model
    sees the same prompt on either engine, history of calls and results included."""
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    answer = complete(real_engine, messages=messages, tools=TOOLS, max_tokens=1)
    assert answer.status_code == 200, answer.text
    local = chat.render(
        tokenizer, msgspec.convert(messages, list[Message]), msgspec.convert(TOOLS, list[Tool])
    )
    assert "<tools>" in local and "<tool_response>" in local
    expected = tokenizer(local, add_special_tokens=False)["input_ids"]
    assert answer.json()["prompt_token_ids"] == expected


def test_a_trainer_checkpoint_is_hot_loaded_served_and_unloaded(
    real_engine, smol_adapter, smol_model
):
    from peft import PeftModel

    url = real_engine.url
    body = {"lora_name": ADAPTER, "lora_path": str(smol_adapter)}
    started = time.monotonic()
    assert httpx.post(f"{url}/load_lora_adapter", json=body, timeout=60).status_code == 200
    load_s = time.monotonic() - started
    listed = {m["id"]: m for m in httpx.get(f"{url}/models", timeout=10).json()["data"]}
    assert listed[ADAPTER]["parent"] == "smol"
    try:
        greedy = {"temperature": 0, "max_tokens": 12}
        base = complete(real_engine, **greedy)
        tuned = complete(real_engine, model=ADAPTER, **greedy).json()
        assert tuned["model"] == ADAPTER
        before = [t["logprob"] for t in base.json()["choices"][0]["logprobs"]["content"]]
        after = [t["logprob"] for t in tuned["choices"][0]["logprobs"]["content"]]
        assert tuned["choices"][0]["token_ids"] != base.json()["choices"][0]["token_ids"] or (
            max(abs(a - b) for a, b in zip(before, after, strict=False)) > 0.05
        )
        # The logprobs vLLM reports under the adapter are the trainer's policy's.
        policy = PeftModel.from_pretrained(smol_model, smol_adapter).eval()
        try:
            choice = tuned["choices"][0]
            mine = trainer_logprobs(policy, tuned["prompt_token_ids"], choice["token_ids"])
        finally:
            policy.unload()  # smol_model is shared: leave it without LoRA layers
        theirs = [t["logprob"] for t in choice["logprobs"]["content"]]
        assert max(abs(a - b) for a, b in zip(theirs, mine, strict=True)) < 2e-3
    finally:
        gone = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=60)
    assert gone.status_code == 200
    after = complete(real_engine, model=ADAPTER)
    assert after.status_code == 404 and "does not exist" in after.text
    assert load_s < 30


def test_adapters_past_the_engines_cache_are_loaded_again_and_answer_as_themselves(
    real_engine, bundled_dir, tmp_path
):
    """One more adapter than the engine holds (`--max-cpu-loras`), asked for in turn: each
    request names one taken out for room. Each answer is its own adapter's, named by it:
    the tokens and logprobs of its first answer, and unlike the others' and the base's."""
    url = real_engine.url
    names = [f"ckpt-lru-{i}" for i in range(REAL_ENGINE_ADAPTERS + 1)]
    for i, name in enumerate(names):
        path = make_adapter(
            bundled_dir, tmp_path / name, seed=30 + i, r=8, targets=["q_proj", "v_proj"], std=0.2
        )
        body = {"lora_name": name, "lora_path": str(path)}
        assert httpx.post(f"{url}/load_lora_adapter", json=body, timeout=60).status_code == 200
    greedy = {"temperature": 0, "max_tokens": 8}

    def answer(model: str) -> tuple[list[int], list[float]]:
        got = complete(real_engine, model=model, **greedy)
        assert got.status_code == 200, got.text
        assert got.json()["model"] == model
        choice = got.json()["choices"][0]
        return choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]

    def close(a, b) -> bool:
        return a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) < 2e-3

    try:
        first = {name: answer(name) for name in names}
        for name in names * 2:
            assert close(answer(name), first[name]), name
        base = answer("smol")
        for i, name in enumerate(names):
            others = [first[n] for n in names[i + 1 :]] + [base]
            assert not any(close(first[name], other) for other in others), name
    finally:
        for name in names:
            httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def test_an_adapter_in_the_cache_directory_is_loaded_by_name_on_its_first_request(
    real_engine, smol_adapter, bundled_dir
):
    """vLLM's LoRA resolver, switched on by `--adapter-cache-dir` alone."""
    cache = real_engine.adapter_cache
    shutil.copytree(smol_adapter, cache / "ckpt-resolved")
    config = json.loads((cache / "ckpt-resolved" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(bundled_dir)
    answer = complete(real_engine, model="ckpt-resolved", max_tokens=4)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "ckpt-resolved"
    unknown = complete(real_engine, model="ckpt-nowhere")
    assert unknown.status_code == 404


def test_a_checkpoint_published_to_the_bucket_is_fetched_and_served_by_name(
    real_engine, smol_adapter
):
    """In vLLM, onjob's resolver plugin (`engine/vllm_plugin.py`, loaded from the entry
    point `onjob engine install vllm` installs); in the local engine, `resolver.py`: a name
    the engine does not serve is fetched from the bucket into the host's cache, then
    served."""
    from onjob import published
    from onjob.bucket import Bucket

    bucket = Bucket.from_url(real_engine.adapter_bucket, endpoint_url=real_engine.s3)
    assert published.publish(bucket, smol_adapter, "ckpt-published")
    answer = complete(real_engine, model="ckpt-published", max_tokens=4)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "ckpt-published"
    assert (real_engine.adapter_cache / "ckpt-published" / "adapter_config.json").is_file()


@pytest.fixture(scope="module")
def proxy(real_engine, tmp_path_factory):
    db = tmp_path_factory.mktemp("vllm-proxy") / "onjob.duckdb"
    env = {"ONJOB_LOOP__INTERVAL_S": "0"}
    with ServerProcess(["--engine-url", real_engine.url, "--db", str(db)], env=env) as server:
        server.db, server.backend = db, real_engine.backend
        yield server


COLUMNS = (
    "status",
    "stream",
    "served_model",
    "untrainable",
    "completion_token_ids",
    "completion_logprobs",
)


def masked(server) -> str | None:
    """How an answer decoded under a grammar is logged: vLLM's logprobs are the masked
    distribution's, so untrainable; the local engine reports the model's own, and says so
    (docs/engines.md, "Logprobs under a grammar")."""
    return "masked" if server.backend == "vllm" else None


def logged(server, exchange_id: str) -> dict:
    """The exchange's row, through the server that holds the database (`onjob sql`)."""
    assert exchange_id.replace("-", "").replace("_", "").isalnum()
    query = f"SELECT {', '.join(COLUMNS)} FROM exchanges WHERE id = '{exchange_id}'"
    reply = httpx.post(
        f"{server.base}/admin/sql", json={"query": query}, headers=admin_of(server), timeout=30
    )
    assert reply.status_code == 200, reply.text
    (row,) = reply.json()["rows"]
    return dict(zip(COLUMNS, row, strict=True))


def test_the_proxy_logs_each_answer_with_the_tokens_the_client_got(proxy):
    client = OpenAI(base_url=proxy.url, api_key="unused", max_retries=0, timeout=120)
    whole = client.chat.completions.with_raw_response.create(
        model="agent", messages=QUESTION, max_tokens=16
    )
    reply = whole.parse()
    assert reply.choices[0].message.content
    assert reply.choices[0].logprobs is None  # asked of the engine, not passed on
    row = logged(proxy, whole.headers["x-onjob-exchange-id"])
    assert row["status"] == 200 and row["untrainable"] is None
    assert row["served_model"] == "smol"
    (ids,), (logprobs,) = row["completion_token_ids"], row["completion_logprobs"]
    assert len(ids) == len(logprobs) == reply.usage.completion_tokens

    stream = client.chat.completions.with_raw_response.create(
        model="agent", messages=QUESTION, max_tokens=16, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
    row = logged(proxy, stream.headers["x-onjob-exchange-id"])
    assert row["stream"] is True and row["untrainable"] is None
    (ids,), (logprobs,) = row["completion_token_ids"], row["completion_logprobs"]
    assert len(ids) == len(logprobs) > 0 and text


def test_a_forced_tool_call_through_the_proxy_is_a_call_logged_by_its_logprobs(proxy):
    """A strict tool: vLLM 0.32's Hermes structural tag holds a forced call's arguments to
    the schema only then (docs/vllm.md); a non-strict one gets the tag and the name."""
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    strict[0]["function"]["parameters"] = {
        **TOOLS[0]["function"]["parameters"],
        "additionalProperties": False,
    }
    client = OpenAI(base_url=proxy.url, api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model="agent",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=strict,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,  # sampled, 1 in 20 strings runs past 40 tokens: a cut call, no call
    )
    (call,) = raw.parse().choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments).keys() == {"city"}
    assert logged(proxy, raw.headers["x-onjob-exchange-id"])["untrainable"] == masked(proxy)


def test_structured_output_through_the_proxy_follows_the_schema(proxy):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    client = OpenAI(base_url=proxy.url, api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model="agent",
        messages=QUESTION,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "sum", "schema": schema, "strict": True},
        },
        max_tokens=40,
    )
    reply = raw.parse()
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    assert logged(proxy, raw.headers["x-onjob-exchange-id"])["untrainable"] == masked(proxy)


def test_the_responses_api_answers_and_chains(proxy):
    client = OpenAI(base_url=proxy.url, api_key="unused", max_retries=0, timeout=120)
    first = client.responses.create(model="agent", input="Say hello.", max_output_tokens=12)
    assert first.output_text and first.status in ("completed", "incomplete")
    second = client.responses.create(
        model="agent",
        input="Again, in French.",
        previous_response_id=first.id,
        max_output_tokens=12,
    )
    assert second.output_text
    row = logged(proxy, second.id)
    assert row["status"] == 200 and row["served_model"] == "smol"


def test_serve_start_engine_runs_vllm_and_takes_it_down_when_killed(tmp_path, bundled_dir):
    port = free_port()
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_ENGINE__ARGS": json.dumps(SMALL),
    }
    server = ServerProcess(
        [
            "--start-engine",
            "--backend",
            "vllm",
            "--model",
            str(bundled_dir),
            "--engine-url",
            f"http://127.0.0.1:{port}/v1",
            "--db",
            str(tmp_path / "onjob.duckdb"),
        ],
        env=env,
        timeout=900,
    ).start()
    try:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="agent", messages=QUESTION, max_tokens=4)
        assert reply.model == "agent" and reply.choices[0].message.content is not None
        (api_server,) = _listeners(port)
        vllm_pids = _group(os.getpgid(api_server))
        assert len(vllm_pids) >= 3, vllm_pids  # the API server, an engine core, a worker
    finally:
        server.proc.kill()  # SIGKILL to the server alone: none of its shutdown code runs
        server.proc.wait()
    deadline = time.monotonic() + 60
    while [p for p in vllm_pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in vllm_pids if _alive(p)], "vLLM outlived the server that started it"
    assert not port_taken(port)


def _listeners(port: int) -> list[int]:
    """The pids of the processes listening on `port` (from /proc, as `ss -p` reads it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inodes.add(fields[9])
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            pids.append(int(pid))
    return pids


def _group(pgid: int) -> list[int]:
    """The processes of process group `pgid`."""
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_restarted_vllm_gets_the_live_checkpoint_back_before_serving_it(
    tmp_path, bundled_dir, smol_adapter
):
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, smol_adapter, ADAPTER, bundled_dir)
    store.close()
    engine = EngineProcess(vllm_args(bundled_dir), timeout=600).start()
    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__HEALTH_INTERVAL_S": "1"}
    try:
        with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
            make_live(server, ADAPTER)
            client = OpenAI(base_url=server.url, api_key="unused", max_retries=5, timeout=120)
            ask = {"model": "agent", "messages": QUESTION, "max_tokens": 2}
            assert client.chat.completions.create(**ask).choices
            engine.kill()  # the API server, its engine core and its worker
            engine = EngineProcess(vllm_args(bundled_dir), port=engine.port, timeout=600).start()
            # The restart forgot the adapter. The server's health check (every second)
            # notices and loads it again, which may be before this test first sees the
            # new engine, so what is checked is that it did: its log says so.
            # The openai client retries the 503s ("not loaded", Retry-After: 1) by itself.
            raw = client.chat.completions.with_raw_response.create(**ask)
            assert raw.http_response.status_code == 200
            assert ADAPTER in adapters_in(engine)
            assert "healthy again; loading its adapters" in server.output()
            assert "adapters reloaded in" in server.output()
        served = rows(db, "SELECT served_model FROM exchanges WHERE status = 200")
        assert {r["served_model"] for r in served} == {ADAPTER}
    finally:
        engine.stop()
