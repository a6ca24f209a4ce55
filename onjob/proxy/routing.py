"""Model aliases: the names clients use, mapped to what the engine serves.

An alias (say `agent`) maps to its live checkpoint: an adapter name the engine
has loaded, or `None` for the engine's base model. The base model's own name is
an alias of itself, so an agent that already names it changes nothing but its
`base_url`. (The canary arm joins here in a later change.)
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from .errors import NotFound, UpstreamStatus
from .upstream import Upstream

LIVE = "live"


@dataclass(frozen=True)
class Route:
    alias: str
    model: str  # the engine's model id to send
    checkpoint: str | None  # None: the base model
    arm: str


class Router:
    def __init__(self, aliases: dict[str, str | None], upstream: Upstream) -> None:
        self.aliases = dict(aliases)
        self.upstream = upstream
        self.base_model: str | None = None

    async def discover(self) -> str:
        """The engine's base model id (the model without a parent), asked once."""
        if self.base_model is None:
            resp = await self.upstream.request("GET", "/models")
            body = await resp.read()
            if resp.status != 200:
                raise UpstreamStatus(resp.status, body, resp.content_type)
            models = msgspec.json.decode(body)["data"]
            base = [m["id"] for m in models if not m.get("parent")] or [models[0]["id"]]
            self.base_model = base[0]
        return self.base_model

    def names(self) -> list[str]:
        names = list(self.aliases)
        if self.base_model and self.base_model not in names:
            names.append(self.base_model)
        return names

    async def resolve(self, name: str) -> Route:
        base = await self.discover()
        if name in self.aliases:
            checkpoint = self.aliases[name]
            return Route(name, checkpoint or base, checkpoint, LIVE)
        if name == base:
            return Route(name, base, None, LIVE)
        raise NotFound(
            f"The model `{name}` does not exist. This onjob serves: {', '.join(self.names())}.",
            param="model",
        )
