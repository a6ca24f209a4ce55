"""Loading and unloading adapters in the engine through vLLM's endpoints (the local engine
speaks the same), so one piece of code drives both."""

from __future__ import annotations

import httpx


class EngineControlError(Exception):
    pass


async def loaded(engine: httpx.AsyncClient) -> set[str]:
    """The adapters the engine says it serves (models with a parent)."""
    try:
        resp = await engine.get("/models")
        resp.raise_for_status()
        return {m["id"] for m in resp.json()["data"] if m.get("parent")}
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise EngineControlError(f"cannot list the engine's models: {exc!r}") from exc


async def ensure_loaded(engine: httpx.AsyncClient, name: str, path: str) -> bool:
    """Load `name` from `path` unless the engine has it; True if it was loaded now."""
    if name in await loaded(engine):
        return False
    try:
        resp = await engine.post("/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    except httpx.HTTPError as exc:
        raise EngineControlError(f"cannot reach the engine to load {name}: {exc!r}") from exc
    if resp.status_code != 200:
        raise EngineControlError(f"the engine could not load {name}: {resp.text[:300]}")
    return True


async def unload(engine: httpx.AsyncClient, name: str) -> None:
    """Unload `name`; an engine that no longer has it (404) is what was wanted."""
    try:
        resp = await engine.post("/unload_lora_adapter", json={"lora_name": name})
    except httpx.HTTPError as exc:
        raise EngineControlError(f"cannot reach the engine to unload {name}: {exc!r}") from exc
    if resp.status_code not in (200, 404):
        raise EngineControlError(
            f"the engine could not unload {name} ({resp.status_code}): {resp.text[:300]}"
        )
