"""Who may change the engine's adapters: `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter` load code-bearing weights from any path the engine can read and
drop what is being served, so they answer loopback peers only and, when the engine has an
`adapter_token` (`ONJOB_ENGINE_ADAPTER_TOKEN`; `onjob serve --start-engine` makes one and
hands it to its child), only requests that carry it as `Authorization: Bearer <token>`.

The token is what keeps out the other local processes (anything on the host reaches
loopback, a browser's page included); loopback alone keeps out the network when the
engine listens on every address for its OpenAI routes.
"""

from __future__ import annotations

import hmac
import ipaddress

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from .errors import Forbidden, Unauthorized


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def adapter_guard(token: str | None):
    """A Litestar guard for the adapter routes."""
    expected = f"Bearer {token}".encode() if token else None

    def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        peer = connection.client.host if connection.client else None
        if not _loopback(peer):
            raise Forbidden(f"Adapters are loaded from the engine's host only (peer {peer}).")
        if expected is None:
            return
        given = connection.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise Unauthorized(
                "The engine's adapter routes need its adapter token: send "
                "`Authorization: Bearer <token>` (ONJOB_ENGINE_ADAPTER_TOKEN)."
            )

    return guard
