"""The OpenAI-compatible front door: routes each request to its checkpoint, forwards it to
the engine (logprobs and token ids always on), answers in OpenAI's exact shape, and
hands the exchange to the collector without waiting on disk.

`create_app(settings, upstream=..., collector=...)` builds the Litestar app;
`LeanUpstream` is the production client to the engine (`AiohttpUpstream` the one before
it, still a setting away), `HttpxUpstream` wraps any `httpx.AsyncClient` (tests give it a
`MockTransport`). `Router` holds each alias's
live and canary arms (`X-Onjob-Arm` pins one for a request).
"""

from .app import ARM_HEADER, EXCHANGE_HEADER, SCENARIO_HEADER, TRAJECTORY_HEADER, create_app
from .errors import ProxyError
from .lean import LeanUpstream
from .routing import Router
from .settings import Canary, ProxySettings
from .upstream import AiohttpUpstream, HttpxUpstream, Upstream

__all__ = [
    "ARM_HEADER",
    "EXCHANGE_HEADER",
    "SCENARIO_HEADER",
    "TRAJECTORY_HEADER",
    "AiohttpUpstream",
    "Canary",
    "HttpxUpstream",
    "LeanUpstream",
    "ProxyError",
    "ProxySettings",
    "Router",
    "Upstream",
    "create_app",
]
