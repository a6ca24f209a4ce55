"""Loading and unloading adapters in the engine through vLLM's endpoints (the local engine
speaks the same), so one piece of code drives both.

What vLLM answers (`vllm/entrypoints/openai/models/serving.py`, formerly
`serving_models.py`; the missing path from `vllm/exceptions.py`), as
`{"error": {"message", "type", "param", "code"}}`, or in vLLM before 0.10.2 the same
fields at the top level beside `"object": "error"`:

- a load of a name it serves: 400 "The lora adapter 'NAME' has already been loaded."
  That is what was wanted (another caller loaded it since `/models` was read).
- a load from a path it cannot read: 404 "Loading lora NAME failed: No adapter found for
  PATH" (the local engine: 400 "No adapter found at 'PATH' ..."). The trainer wrote the
  checkpoint on a disk the engine's host does not see.
- an unload of a name it does not serve: 404 "The lora adapter 'NAME' cannot be found."
  Also what was wanted.
- either route with runtime loading off (`VLLM_ALLOW_RUNTIME_LORA_UPDATING` unset): 404
  `{"detail": "Not Found"}`, which is no answer about the adapter at all; an unload
  answered so is not done.
"""

from __future__ import annotations

import httpx

from ..errors import AdapterPathUnreadable, EngineControlError, EngineUnreachable

# The setting that says where checkpoints are written (the trainer's, in the server's
# settings), named in the error when the engine cannot read one.
CHECKPOINTS_SETTING = "trainer.checkpoints_dir"


async def loaded(engine: httpx.AsyncClient) -> set[str]:
    """The adapters the engine says it serves (models with a parent)."""
    try:
        resp = await engine.get("/models")
        resp.raise_for_status()
        return {m["id"] for m in resp.json()["data"] if m.get("parent")}
    except httpx.TransportError as exc:
        raise EngineUnreachable(f"cannot reach the engine {engine.base_url}: {exc!r}") from exc
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise EngineControlError(f"cannot list the engine's models: {exc!r}") from exc


async def ensure_loaded(engine: httpx.AsyncClient, name: str, path: str) -> bool:
    """Load `name` from `path` unless the engine has it; True if it was loaded now."""
    if name in await loaded(engine):
        return False
    try:
        resp = await engine.post("/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    except httpx.HTTPError as exc:
        raise EngineUnreachable(f"cannot reach the engine to load {name}: {exc!r}") from exc
    if resp.status_code == 200:
        return True
    message = _message(resp)
    if resp.status_code == 400 and "has already been loaded" in message:
        return False
    if message and "No adapter found" in message:
        raise AdapterPathUnreadable(
            f"the engine cannot read {path}: put checkpoints on storage both hosts see "
            f"({CHECKPOINTS_SETTING})"
        )
    raise EngineControlError(f"the engine could not load {name}: {_why(resp, message)}")


async def unload(engine: httpx.AsyncClient, name: str) -> None:
    """Unload `name`; an engine that says it does not serve it has done what was wanted.
    Any other answer raises: the adapter may still be loaded."""
    try:
        resp = await engine.post("/unload_lora_adapter", json={"lora_name": name})
    except httpx.HTTPError as exc:
        raise EngineUnreachable(f"cannot reach the engine to unload {name}: {exc!r}") from exc
    if resp.status_code == 200:
        return
    message = _message(resp)
    if resp.status_code == 404 and message and "cannot be found" in message:
        return
    raise EngineControlError(f"the engine could not unload {name}: {_why(resp, message)}")


def _message(resp: httpx.Response) -> str | None:
    """The message of an OpenAI/vLLM error body, in either of vLLM's shapes; None for any
    other body (a route that does not exist answers `{"detail": "Not Found"}`)."""
    try:
        body = resp.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    message = error.get("message")
    return message if isinstance(message, str) else None


def _why(resp: httpx.Response, message: str | None) -> str:
    if message is not None:
        return f"{resp.status_code}: {message[:300]}"
    if resp.status_code in (404, 405):
        return (
            f"{resp.request.url.path} answered {resp.status_code} {resp.text[:100]!r}: runtime "
            "LoRA loading is off (start vLLM with --enable-lora and "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, as `onjob engine --backend vllm` does)"
        )
    return f"{resp.status_code}: {resp.text[:300]}"
