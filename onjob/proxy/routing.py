"""Model aliases and their arms: the names clients use, mapped to what the engine serves.

An alias (say `agent`) has a live checkpoint (an adapter the engine has loaded, or
`None` for the engine's base model) and optionally a canary that serves a
`fraction` of its conversations. The arm is a hash of the conversation (the name the
client gave it, else its opening: `Exchange.open`) salted by the canary's name, so a
conversation never switches arms during a canary, whichever proxy process serves each
turn, and each canary draws its own conversations. A Responses API chain keeps the
arm of its previous turn (`sticky`). `X-Onjob-Arm` pins `live`, `canary` or a named
checkpoint for one request: one the alias serves (live or canary), or any with the admin
key (a candidate, a rolled-back checkpoint: what no user should get by asking). The base
model's own name is an alias of itself, so an agent that already names it changes nothing
but its `base_url`.

With tenants (`proxy.tenants`), an alias has arms per lineage (`tenants.py`): a request is
routed by its API key to its tenant's live or canary, or to the shared lineage's when no
tenant holds the key; a pin picks among its own lineage's arms only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from ..collector.scope import SEPARATOR, lineage_name
from .errors import BadRequest, Forbidden, NotFound, UpstreamStatus
from .tenants import Tenants
from .upstream import Upstream

LIVE = "live"
CANARY = "canary"
PINNED = "pinned"


@dataclass(frozen=True)
class Route:
    alias: str
    model: str  # the engine's model id to send
    checkpoint: str | None  # None: the base model
    arm: str
    lineage: str  # the lineage whose arm this is: the alias's shared one, or `alias@tenant`


@dataclass(frozen=True)
class Arms:
    live: str | None = None
    canary: str | None = None
    fraction: float = 0.0


def canary_share(conversation: str, canary: str) -> float:
    """Where a conversation falls in [0, 1) for `canary`: below the canary's fraction, it
    is the canary's. Salted by the canary's name, so each canary gets its own draw of
    conversations, not the same bucket every time."""
    key = f"{canary}\x00{conversation}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Router:
    def __init__(
        self, aliases: dict[str, str | None], upstream: Upstream, tenants: Tenants | None = None
    ) -> None:
        self.aliases = list(aliases)
        self.tenants = tenants or Tenants()
        # lineage name (`alias`, or `alias@tenant`) -> its arms; each starts at the alias's
        # configured live checkpoint
        self.arms = {name: Arms(live) for name, live in self.tenants.defaults(aliases).items()}
        self.upstream = upstream
        self.base_model: str | None = None
        self.listeners: list[Callable[[], None]] = []  # called after each change

    @classmethod
    def from_settings(cls, settings, upstream: Upstream) -> Router:
        """Aliases and canaries as `[proxy]` configures them."""
        router = cls(settings.aliases, upstream, Tenants.of(settings))
        for name, canary in settings.canaries.items():
            live = router.arms[name].live if name in router.arms else None
            router.set(name, live, canary.checkpoint, canary.fraction)
        return router

    def set(
        self, alias: str, live: str | None, canary: str | None = None, fraction: float = 0.0
    ) -> None:
        """Change an alias's routing (the deploy side calls this; the next request sees it)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"canary fraction {fraction} is not in [0, 1]")
        arms = Arms(live, canary, fraction if canary else 0.0)
        if self.arms.get(alias) == arms:
            return
        if alias not in self.arms and alias.rpartition(SEPARATOR)[0] not in self.aliases:
            self.aliases.append(alias)  # an alias the log routes that the settings lack
        self.arms[alias] = arms
        for listener in self.listeners:
            listener()

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

    def lineage_of(self, name: str, api_key_id: str | None) -> str:
        """The lineage that answers `api_key_id` when it asks for `name`: its tenant's, when
        the alias has one, else the alias's shared one."""
        tenant = self.tenants.tenant_of(api_key_id)
        own = lineage_name(name, tenant)
        return own if own in self.arms else name

    def sticky(
        self, name: str, checkpoint: str | None, api_key_id: str | None = None
    ) -> str | None:
        """The pin that keeps a conversation on `checkpoint`'s arm of `name`, if it still is
        one (None: draw the arm as usual)."""
        arms = self.arms.get(self.lineage_of(name, api_key_id))
        if arms is None:
            return None
        if arms.canary and checkpoint == arms.canary:
            return CANARY
        if checkpoint == arms.live:
            return LIVE
        return None

    async def resolve(
        self,
        name: str,
        conversation: str,
        pin: str | None = None,
        any_checkpoint: bool = False,
        api_key_id: str | None = None,
    ) -> Route:
        base = await self.discover()
        line = self.lineage_of(name, api_key_id)
        arms = self.arms.get(line) if name in self.aliases else None
        if arms is None:
            if name != base:
                raise NotFound(
                    f"The model `{name}` does not exist. This onjob serves: "
                    f"{', '.join(self.names())}.",
                    param="model",
                )
            arms = Arms()
        if pin and pin not in (LIVE, CANARY):
            # The base model is anyone's to ask for by name (it is an alias of itself).
            if not any_checkpoint and pin not in (arms.live, arms.canary, base):
                served = ", ".join(c for c in (arms.live, arms.canary) if c)
                raise Forbidden(
                    f"X-Onjob-Arm: `{pin[:100]}` is not a checkpoint `{name}` serves"
                    + (f" ({served})" if served else "")
                    + ": pin `live` or `canary`; pinning another checkpoint needs the admin key."
                )
            return Route(name, pin, pin, PINNED, line)
        if pin == CANARY and not arms.canary:
            whose = "" if line == name else " for this key's tenant"
            raise BadRequest(f"`{name}` has no canary{whose} to pin (X-Onjob-Arm: canary).")
        canary = pin == CANARY or (
            pin is None and arms.canary and canary_share(conversation, arms.canary) < arms.fraction
        )
        if canary:
            return Route(name, arms.canary, arms.canary, CANARY, line)
        return Route(name, arms.live or base, arms.live, LIVE, line)

    def adapters(self) -> set[str]:
        """Every adapter some alias routes to (live or canary): what each engine must serve."""
        return {name for a in self.arms.values() for name in (a.live, a.canary) if name}

    def live(self, route: Route) -> Route:
        """The live arm of `route`'s lineage: what answers when a canary fails."""
        arms = self.arms.get(route.lineage, Arms())
        return Route(route.alias, arms.live or self.base_model, arms.live, LIVE, route.lineage)
