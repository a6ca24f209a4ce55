"""The proxy's routes, a room each: `chat` (chat and legacy completions), `responses` (the
Responses API and its stored responses), `catalog` (models and the OpenAPI document),
`feedback`. Each handler is a module-level function, Litestar's way, that takes what the
rooms share as its `serving` dependency (`Serving`); the hot ones are also answered by
`front.py` as bare ASGI, through the same functions given the same `Serving`."""

from __future__ import annotations

from dataclasses import dataclass

from ..replicas import Forwarder
from ..settings import ProxySettings
from ..traffic import Traffic


@dataclass(frozen=True)
class Serving:
    """What every room's handlers share: the settings, the traffic (the router, the
    engines, the collector), and in a proxy-only process the forwarder of what needs the
    database to the primary (None in the primary)."""

    settings: ProxySettings
    traffic: Traffic
    forward: Forwarder | None = None
