"""`Client` and `AsyncClient`: the calls a program makes to a running `onjob serve`,
besides the OpenAI routes its agent already uses (point the `openai` client at
`<server>/v1` for those).

    from onjob.client import Client

    with Client("http://127.0.0.1:8000", api_key="sk-...", admin_key="adm-...") as onjob:
        onjob.feedback(1.0, exchange_id=answer.id, metric="resolved")
        print(onjob.status().aliases)
        onjob.canary("ckpt-7", alias="agent", fraction=0.1)

`feedback` needs an API key (the one the exchange was made with: a key's feedback reaches
only its own exchanges), or none on a server without keys; every other call the admin
key. Answers are the same typed records the admin API encodes; errors are `Refused` (the
server's status and message) or `Unreachable`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx
import msgspec

from ..collector.forget import Removed
from ..collector.readonly import Answer
from ..deploy.admin import AliasBody, CanaryBody, ExportBody, ForgetBody, LoopBody, SqlBody
from ..deploy.records import Change, Checkpoint
from ..deploy.status import LoopView, ServerStatus
from ..proxy.protocol import Feedback, FeedbackRecorded
from .calls import Call, partial_of, read, root_of
from .errors import Unreachable

DEFAULT_URL = "http://127.0.0.1:8000"


class _Calls:
    """Every call, written once: each method builds its `Call` and hands it to `_send`,
    which `Client` answers with the record and `AsyncClient` with an awaitable of it."""

    def _send(self, call: Call) -> Any:  # pragma: no cover - each client has its own
        raise NotImplementedError

    def feedback(
        self,
        value: float,
        *,
        exchange_id: str | None = None,
        trajectory_id: str | None = None,
        metric: str | None = None,
        comment: str | None = None,
    ) -> FeedbackRecorded:
        """A user's signal on one exchange (`exchange_id`: the id of the answer, or
        `X-Onjob-Exchange-Id`) or a whole conversation (`trajectory_id`: the name it was
        given). `metric` names it ("thumbs", "resolved"): each metric is scored and checked
        against the judges on its own, weighted by `judge.feedback_weights`."""
        body = Feedback(
            value=value,
            exchange_id=exchange_id,
            trajectory_id=trajectory_id,
            comment=comment,
            metric=metric,
        )
        return self._send(Call("POST", "/v1/feedback", FeedbackRecorded, key="api", body=body))

    def status(self) -> ServerStatus:
        """Routing per lineage, the latest deployments, the loop, the release mode, each
        judge's agreement with users' feedback, the fitted settings."""
        return self._send(Call("GET", "/admin/status", ServerStatus))

    def checkpoints(self) -> list[Checkpoint]:
        """The registry, oldest first."""
        return self._send(Call("GET", "/admin/checkpoints", list[Checkpoint], pick="checkpoints"))

    def canary(
        self,
        checkpoint: str,
        *,
        alias: str = "agent",
        fraction: float = 0.1,
        tenant: str | None = None,
        reason: str = "set by hand",
    ) -> Change:
        """Serve `checkpoint` to `fraction` of the alias's conversations (of `tenant`'s
        lineage, else the shared one)."""
        body = CanaryBody(
            alias=alias, checkpoint=checkpoint, fraction=fraction, reason=reason, tenant=tenant
        )
        return self._send(Call("POST", "/admin/canary", Change, body=body))

    def promote(
        self, *, alias: str = "agent", tenant: str | None = None, reason: str = "by hand"
    ) -> Change:
        """Make the lineage's canary its live checkpoint."""
        body = AliasBody(alias=alias, reason=reason, tenant=tenant)
        return self._send(Call("POST", "/admin/promote", Change, body=body))

    def rollback(
        self, *, alias: str = "agent", tenant: str | None = None, reason: str = "by hand"
    ) -> Change:
        """Stop the lineage's canary (or, with none, go back to the previous live)."""
        body = AliasBody(alias=alias, reason=reason, tenant=tenant)
        return self._send(Call("POST", "/admin/rollback", Change, body=body))

    def pause(self) -> LoopView:
        """Pause the loop (an iteration in flight is cancelled); the loop's state."""
        return self._send(Call("POST", "/admin/loop", LoopView, body=LoopBody(running=False)))

    def resume(self) -> LoopView:
        """Resume the loop; the loop's state."""
        return self._send(Call("POST", "/admin/loop", LoopView, body=LoopBody(running=True)))

    def sql(self, query: str, *, limit: int = 1000) -> Answer:
        """One read-only SELECT on the server's database (`docs/data.md`)."""
        body = SqlBody(query=query, limit=limit)
        return self._send(Call("POST", "/admin/sql", Answer, body=body))

    def tables(self, *, tenant: bool = False) -> list[str]:
        """The database's tables (`tenant`: those that hold a tenant's rows)."""
        params = {"tenant": "true"} if tenant else {}
        return self._send(Call("GET", "/admin/tables", list[str], params=params, pick="tables"))

    def forget(
        self,
        *,
        trajectory: str | None = None,
        api_key: str | None = None,
        before: str | None = None,
    ) -> Removed:
        """Delete one conversation, an API key's traffic, or conversations ended before a
        date (ISO), with all derived from them; the answer lists what was removed and the
        checkpoints already trained on it."""
        body = ForgetBody(trajectory=trajectory, api_key=api_key, before=before)
        return self._send(Call("POST", "/admin/forget", Removed, body=body))

    def export(self, table: str, path: str | Path, *, tenant: str | None = None) -> Path:
        """One table (`tenant`: only that tenant's rows) as a Parquet file at `path`,
        written whole or not at all."""
        body = ExportBody(table=table, tenant=tenant)
        return self._send(Call("POST", "/admin/export", Path, body=body, into=Path(path)))


class _Base:
    _http: httpx.Client | httpx.AsyncClient  # each client's own

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        admin_key: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.base_url = root_of(base_url)
        self._keys = {"api": api_key, "admin": admin_key}
        self.timeout = timeout

    def _request(self, call: Call) -> httpx.Request:
        """The call as the request each client sends (its timeout the client's)."""
        key = self._keys[call.key]
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        content = None
        if call.body is not None:
            content = msgspec.json.encode(call.body)
            headers["Content-Type"] = "application/json"
        url = self.base_url + call.path
        return self._http.build_request(
            call.method, url, content=content, params=call.params, headers=headers
        )

    def _unreachable(self, exc: httpx.TransportError) -> Unreachable:
        return Unreachable(f"{self.base_url} did not answer ({type(exc).__name__}: {exc})")


class Client(_Base, _Calls):
    """A running onjob server, called synchronously (a `with` block closes it)."""

    def __init__(self, base_url: str = DEFAULT_URL, *, transport=None, **kw) -> None:
        super().__init__(base_url, **kw)
        self._http = httpx.Client(timeout=self.timeout, transport=transport)

    def _send(self, call: Call) -> Any:
        try:
            if call.into is None:
                return read(call, self._http.send(self._request(call)))
            with contextlib.closing(self._http.send(self._request(call), stream=True)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    return read(call, resp)
                partial = partial_of(call.into)
                with partial.open("wb") as f:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
            return partial.replace(call.into)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base, _Calls):
    """A running onjob server, called from asyncio: each method returns an awaitable of
    what `Client`'s returns (`async with` closes it)."""

    def __init__(self, base_url: str = DEFAULT_URL, *, transport=None, **kw) -> None:
        super().__init__(base_url, **kw)
        self._http = httpx.AsyncClient(timeout=self.timeout, transport=transport)

    async def _send(self, call: Call) -> Any:
        try:
            if call.into is None:
                return read(call, await self._http.send(self._request(call)))
            resp = await self._http.send(self._request(call), stream=True)
            async with contextlib.aclosing(resp):
                if resp.status_code >= 400:
                    await resp.aread()
                    return read(call, resp)
                partial = partial_of(call.into)
                with partial.open("wb") as f:
                    async for chunk in resp.aiter_bytes():
                        f.write(chunk)
            return partial.replace(call.into)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
