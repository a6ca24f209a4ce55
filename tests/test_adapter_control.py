"""Loading and unloading adapters against vLLM's LoRA endpoints, scripted at the HTTP
boundary with the bodies vLLM answers (vllm/entrypoints/openai/models/serving.py and
vllm/exceptions.py), in both of its error shapes; and the user's side of an adapter the
engine cannot read, through a real `onjob serve`, engine and `onjob canary`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings, Store
from onjob.deploy.act import adapters, deployments, registry
from onjob.deploy.act.operator import Operator
from onjob.proxy import Router

ALIAS = "agent"
CHECKPOINTS_HINT = "put checkpoints on storage both hosts see (trainer.checkpoints_dir)"


class VLLM:
    """vLLM's /v1/models, /v1/load_lora_adapter and /v1/unload_lora_adapter. `readable`:
    the adapter paths that exist on the engine's host; `runtime_updating=False`: started
    without VLLM_ALLOW_RUNTIME_LORA_UPDATING (the two routes do not exist); `legacy`: the
    error shape of vLLM before 0.10.2; `stale_models`: /models answers as before the
    loads another caller made."""

    def __init__(self, readable=(), *, legacy=False, stale_models=False) -> None:
        self.readable = set(readable)
        self.lora_requests: dict[str, str] = {}
        self.runtime_updating = True
        self.legacy = legacy
        self.stale_models = stale_models
        self.calls: list[tuple[str, str]] = []

    def error(self, status: int, message: str, kind: str) -> httpx.Response:
        fields = {"message": message, "type": kind, "param": None, "code": status}
        body = {"object": "error", **fields} if self.legacy else {"error": fields}
        return httpx.Response(status, json=body)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            names = [] if self.stale_models else sorted(self.lora_requests)
            data = [{"id": "base", "object": "model", "parent": None}]
            data += [{"id": n, "object": "model", "parent": "base"} for n in names]
            return httpx.Response(200, json={"object": "list", "data": data})
        if not self.runtime_updating:
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        name = body.get("lora_name")
        self.calls.append((path.rsplit("/", 1)[-1], name))
        if path.endswith("/load_lora_adapter"):
            lora_path = body.get("lora_path")
            if name in self.lora_requests:
                return self.error(
                    400,
                    f"The lora adapter '{name}' has already been loaded. If you want to load "
                    "the adapter in place, set 'load_inplace' to True.",
                    "InvalidUserInput",
                )
            if lora_path not in self.readable:
                return self.error(
                    404,
                    f"Loading lora {name} failed: No adapter found for {lora_path}",
                    "NotFoundError",
                )
            self.lora_requests[name] = lora_path
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if path.endswith("/unload_lora_adapter"):
            if name not in self.lora_requests:
                return self.error(
                    404, f"The lora adapter '{name}' cannot be found.", "NotFoundError"
                )
            del self.lora_requests[name]
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")
        return httpx.Response(404, json={"detail": "Not Found"})


def client_for(engine: VLLM) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(engine), base_url="http://engine/v1")


@pytest.fixture
def db(tmp_path, tiny_adapter_dir, tiny_model_dir):
    store = Store(tmp_path / "onjob.duckdb")
    for name in ("ckpt-1", "ckpt-2"):
        registry.add(store, tiny_adapter_dir, name, tiny_model_dir)
    store.close()
    return tmp_path / "onjob.duckdb"


def checkpoint_path(db, name: str) -> str:
    store = Store(db)
    try:
        return registry.get(store, name).path
    finally:
        store.close()


async def operator_on(db, engine: VLLM) -> tuple[Operator, Collector]:
    collector = Collector(CollectorSettings(db=db))
    await collector.start()
    op = Operator(
        collector, Router({ALIAS: None}, upstream=None), client_for(engine), {ALIAS: None}
    )
    await op.restore()
    return op, collector


@pytest.mark.parametrize("legacy", [False, True])
def test_a_load_vllm_answers_already_loaded_is_success(db, legacy):
    """Another caller (`onjob compare`, a second loop) loaded it after /models was read."""
    path = checkpoint_path(db, "ckpt-1")
    engine = VLLM(readable=[path], legacy=legacy, stale_models=True)
    engine.lora_requests["ckpt-1"] = path

    async def run():
        assert await adapters.ensure_loaded(client_for(engine), "ckpt-1", path) is False
        op, collector = await operator_on(db, engine)
        try:
            row = await op.set_canary(ALIAS, "ckpt-1", 0.5, reason="r", actor="test")
            assert row.canary == "ckpt-1"
        finally:
            await collector.close()

    asyncio.run(run())
    assert engine.calls == [("load_lora_adapter", "ckpt-1")] * 2


@pytest.mark.parametrize("legacy", [False, True])
def test_an_adapter_path_the_engine_cannot_read_says_where_checkpoints_must_live(db, legacy):
    """The trainer wrote the checkpoint on its own host's disk."""
    engine = VLLM(readable=[], legacy=legacy)
    path = checkpoint_path(db, "ckpt-1")

    async def run():
        op, collector = await operator_on(db, engine)
        try:
            with pytest.raises(adapters.AdapterPathUnreadable) as refused:
                await op.set_canary(ALIAS, "ckpt-1", 0.5, reason="r", actor="test")
            assert str(refused.value) == f"the engine cannot read {path}: {CHECKPOINTS_HINT}"
            # Nothing was routed to an adapter the engine does not have.
            assert op.router.arms[ALIAS].canary is None
            assert ALIAS not in await collector.query(deployments.current)
        finally:
            await collector.close()

    asyncio.run(run())


def test_an_unload_vllm_did_not_do_is_not_taken_as_done(db):
    """Runtime loading turned off after the load (a vLLM restarted without the variable):
    its 404 is no answer about the adapter. The adapter stays on the operator's list and
    goes at the next unload, once the engine can do it."""
    engine = VLLM(readable=[checkpoint_path(db, n) for n in ("ckpt-1", "ckpt-2")])

    async def run():
        op, collector = await operator_on(db, engine)
        try:
            await op.set_canary(ALIAS, "ckpt-1", 0.5, reason="r", actor="test")
            engine.runtime_updating = False
            with pytest.raises(adapters.EngineControlError, match="runtime LoRA loading is off"):
                await adapters.unload(op.engine, "ckpt-1")
            row = await op.rollback(ALIAS, reason="lost", actor="test")
            assert row.canary is None  # the rollback itself stands
            [warning] = row.warnings
            assert "ckpt-1" in warning and "still loaded" in warning
            assert op.stranded == {"ckpt-1"}

            engine.runtime_updating = True
            await op.set_canary(ALIAS, "ckpt-2", 0.5, reason="r", actor="test")
            row = await op.rollback(ALIAS, reason="lost", actor="test")
            assert row.warnings == []
            assert op.stranded == set() and engine.lora_requests == {}
        finally:
            await collector.close()

    asyncio.run(run())
    unloads = [name for call, name in engine.calls if call == "unload_lora_adapter"]
    assert unloads == ["ckpt-1", "ckpt-2"]


@pytest.mark.parametrize("legacy", [False, True])
def test_an_unload_of_an_adapter_vllm_does_not_serve_is_done(legacy):
    engine = VLLM(legacy=legacy)
    asyncio.run(adapters.unload(client_for(engine), "gone"))  # no error
    engine.lora_requests["busy"] = "/ckpt/busy"

    def refuse(request: httpx.Request) -> httpx.Response:
        return engine.error(500, "EngineCore encountered an issue", "InternalServerError")

    with pytest.raises(adapters.EngineControlError, match="500: EngineCore"):
        asyncio.run(adapters.unload(client_for(refuse), "busy"))


def test_the_user_is_told_the_engine_cannot_read_the_checkpoint(
    tmp_path, engine, tiny_adapter_dir, tiny_model_dir
):
    """A real server and engine: the checkpoint is registered, then its directory is not
    where the engine looks (as when the trainer wrote it on another host)."""
    copy = tmp_path / "ckpt-far"
    shutil.copytree(tiny_adapter_dir, copy)
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    registry.add(store, copy, "ckpt-far", tiny_model_dir)
    store.close()
    shutil.rmtree(copy)

    env = {"ONJOB_LOOP__INTERVAL_S": "0", "ONJOB_PROXY__ADMIN_KEY": "adm"}
    with ServerProcess(["--engine-url", engine.url, "--db", str(db)], env=env) as server:
        canary = ["canary", ALIAS, "ckpt-far", "--fraction", "0.5", "--server", server.base]
        done = subprocess.run(
            [sys.executable, "-m", "onjob.cli", *canary],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
    assert done.returncode == 2
    assert f"the engine cannot read {copy.resolve()}: {CHECKPOINTS_HINT}" in done.stderr
