"""Who may call what, decided before any handler runs.

Four doors, each with its credential:

- the OpenAI routes (`/v1/...`, `/openapi.json`): an API key when `proxy.api_keys` has
  any (else anyone who reaches the port, which is then loopback only). The admin key is
  the operator's credential there too, and the only one that may pin any checkpoint with
  `X-Onjob-Arm` (`routing.Router.resolve`);
- the admin API (`/admin/...`): `Authorization: Bearer <admin key>` only, and its POSTs
  carry JSON only;
- the dashboard (`/dashboard...`): the admin key as a Bearer token or as the password of
  HTTP Basic auth, which is what a browser asks for;
- `/metrics`: `Authorization: Bearer <metrics key>` (`proxy.metrics_key`, a scraper's
  credential that opens nothing else) or the admin key.

Before the credential, the page a browser shows. A browser reaches loopback too: any site
can post a form to `http://127.0.0.1:8000/admin/sql` (a `text/plain` form post needs no
preflight), and DNS rebinding points a name the page controls at 127.0.0.1, so the page
is then same-origin with the server. Hence the admin API, the dashboard, `/metrics` and
what a proxy-only process forwards to them answer only a `Host` that names this server (an IP
address: rebinding needs a name; `localhost`; `proxy.host`; `proxy.allowed_hosts`), and
so do the OpenAI routes for a browser (`Sec-Fetch-Site`); every route refuses an `Origin`
other than the request's own host, and admin POSTs take `application/json` only (a page
cannot send it cross-site without a preflight, which no onjob route answers).

`front.py` applies the OpenAI routes' door for the hot routes, Litestar guards (`Doors`'
`*_guard` methods, set once per router) for the rest: no handler checks anything
itself. A handler reads who called from the `Caller` the door left in the request's scope
(`caller`); a route without a door has none, and fails rather than answer.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from .errors import Forbidden, Unauthorized, UnsupportedMediaType
from .settings import ProxySettings

SCOPE_KEY = "onjob.caller"
_SHOWN = 120  # characters of a refused header quoted back in the error


class HeaderLookup(Protocol):
    def get(self, name: str, default: Any = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request to an OpenAI route: an API key's id (None on a server with no
    keys, and for the operator), and whether it holds the admin key."""

    api_key_id: str | None
    admin: bool = False


ANONYMOUS = Caller(None)
OPERATOR = Caller(None, admin=True)


class AskPassword(Unauthorized):
    """A dashboard page without the admin key: answered 401 with `WWW-Authenticate: Basic`,
    so a browser asks for it (`dashboard/pages.py` answers it so)."""


def caller(request: Any) -> Caller:
    """The caller a door placed in `request`'s scope."""
    return request.scope[SCOPE_KEY]


def _bearer(header: str | None) -> str:
    scheme, _, token = (header or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _basic_password(headers: HeaderLookup) -> str:
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        return base64.b64decode(token.strip(), validate=True).decode().partition(":")[2]
    except (ValueError, UnicodeDecodeError):
        return ""


def hostname(host: str) -> str:
    """The name in a `Host` header's value (`name`, `name:port`, `[v6]:port`), lower-case,
    without a trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Doors:
    """The checks of one server's settings (stateless: each package that has routes makes
    its own from the same `ProxySettings`)."""

    def __init__(self, settings: ProxySettings) -> None:
        self._keys = {secret: key_id for key_id, secret in settings.api_keys.items()}
        self._admin = settings.admin_key.encode() if settings.admin_key else None
        self._metrics = settings.metrics_key.encode() if settings.metrics_key else None
        self._configured = frozenset(hostname(h) for h in settings.allowed_hosts)
        self._names = self._configured | {hostname(settings.host), "localhost"}

    # -- the OpenAI routes

    def api(self, headers: HeaderLookup) -> Caller:
        """The caller of an OpenAI route (Unauthorized: no or a wrong API key)."""
        header = headers.get("authorization")
        token = _bearer(header)
        if token and self._is_admin(token):
            return OPERATOR
        if not self._keys:
            return ANONYMOUS
        if not header:
            raise Unauthorized("Missing API key: send `Authorization: Bearer <key>`.")
        key_id = self._keys.get(token)
        if key_id is None:
            raise Unauthorized("Incorrect API key provided.")
        return Caller(key_id)

    # -- the admin API and the dashboard

    def admin(self, headers: HeaderLookup, *, browser: bool = False) -> None:
        """Refuse a request without the admin key (as a Bearer token; with `browser`, also
        as Basic auth's password)."""
        if self._admin is None:
            raise Forbidden(
                "The admin API is closed: this server has no admin key (set proxy.admin_key; "
                "`onjob serve` makes one beside the database when none is set)."
            )
        token = _bearer(headers.get("authorization"))
        if not token and browser:
            token = _basic_password(headers)
        if not (token and self._is_admin(token)):
            if browser:
                raise AskPassword("The dashboard needs the admin key (as the password).")
            raise Unauthorized(
                "Admin routes need `Authorization: Bearer <admin key>`: proxy.admin_key, or "
                "the key `onjob serve` keeps in <database>.admin-key when none is set."
            )

    def _is_admin(self, token: str) -> bool:
        return self._admin is not None and hmac.compare_digest(token.encode(), self._admin)

    # -- the metrics

    def metrics(self, headers: HeaderLookup) -> None:
        """Refuse a scrape without the metrics key or the admin key (as a Bearer token)."""
        if self._admin is None and self._metrics is None:
            raise Forbidden(
                "/metrics is closed: this server has no metrics key and no admin key (set "
                "proxy.metrics_key or proxy.admin_key)."
            )
        token = _bearer(headers.get("authorization"))
        if not (token and (self._is_admin(token) or self._is_metrics(token))):
            raise Unauthorized(
                "/metrics needs `Authorization: Bearer <key>`: proxy.metrics_key, or the admin key."
            )

    def _is_metrics(self, token: str) -> bool:
        return self._metrics is not None and hmac.compare_digest(token.encode(), self._metrics)

    # -- the page a browser shows

    def same_site(self, headers: HeaderLookup, *, host: bool) -> None:
        """Refuse a request a web page of another site sent: an `Origin` other than the
        request's own host (or a configured name); a `Host` that names no address of this
        server (DNS rebinding) with `host`, or from a browser (Fetch Metadata: every
        current browser sends `Sec-Fetch-Site`, and no other client does)."""
        if not host:
            # The OpenAI routes: any name will do for a client that is not a browser (a
            # keyed server is reached by any), and only a browser sends Fetch Metadata.
            host = headers.get("sec-fetch-site") is not None
        given = headers.get("host") if host else None
        if given is not None and not self._names_this_server(hostname(given)):
            raise Forbidden(
                f"Refused: the Host header {given[:_SHOWN]!r} does not name this server (a "
                "web page reaching it through DNS rebinding sends its own). Use its address, "
                "localhost or proxy.host, or add the name to proxy.allowed_hosts."
            )
        origin = headers.get("origin")
        if origin is None:
            return
        if not host:
            given = headers.get("host")
        if not self._same_origin(origin, given):
            raise Forbidden(
                f"Refused: a request from the web page at {origin[:_SHOWN]!r}, another site "
                "than this server. Add its host name to proxy.allowed_hosts if it is yours."
            )

    def _names_this_server(self, name: str) -> bool:
        # An address cannot be rebound: a page can reach this server by one only if it
        # is this server's. A name can, unless it is one this server was told it has.
        return name in self._names or name.endswith(".localhost") or _is_address(name)

    def _same_origin(self, origin: str, host: str | None) -> bool:
        parts = urlsplit(origin.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed frame, a file) or garbage
        if host is not None and parts.netloc.lower() == host.strip().lower():
            return True
        return hostname(parts.netloc) in self._configured

    @staticmethod
    def json_only(headers: HeaderLookup) -> None:
        media = (headers.get("content-type") or "").partition(";")[0].strip().lower()
        if media != "application/json":
            raise UnsupportedMediaType(
                "Admin requests carry a JSON body: send `Content-Type: application/json`."
            )

    # -- Litestar guards: one per router, so no handler can forget its door

    def api_guard(self, connection: Any, _: Any) -> None:
        self.same_site(connection.headers, host=False)
        connection.scope[SCOPE_KEY] = self.api(connection.headers)

    def admin_guard(self, connection: Any, _: Any) -> None:
        self.same_site(connection.headers, host=True)
        self.admin(connection.headers)
        if connection.scope["method"] != "GET":
            self.json_only(connection.headers)

    def dashboard_guard(self, connection: Any, _: Any) -> None:
        self.same_site(connection.headers, host=True)
        self.admin(connection.headers, browser=True)
        if connection.scope["method"] != "GET":  # its buttons: JSON, as the admin API's
            self.json_only(connection.headers)

    def metrics_guard(self, connection: Any, _: Any) -> None:
        # A GET that changes nothing, behind a Bearer key alone; the Host rule is the admin
        # API's (a scraper that names the server by a DNS name lists it in allowed_hosts).
        self.same_site(connection.headers, host=True)
        self.metrics(connection.headers)

    def forward_guard(self, connection: Any, _: Any) -> None:
        """A proxy-only process, before it forwards to the primary (which sees the
        forwarder's own `Host`, so it could not check the browser's)."""
        self.same_site(connection.headers, host=True)
