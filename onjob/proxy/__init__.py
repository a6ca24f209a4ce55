"""The OpenAI-compatible front door: routes each request to its checkpoint, forwards it to
the engine (logprobs and token ids always on), answers in OpenAI's exact shape, and
hands the exchange to the collector without waiting on disk.

`create_app(settings, upstream=..., collector=...)` builds the Litestar app;
`AiohttpUpstream` is the production client to the engine, `HttpxUpstream` wraps
any `httpx.AsyncClient` (tests give it a `MockTransport`).
"""

from .app import EXCHANGE_HEADER, SCENARIO_HEADER, TRAJECTORY_HEADER, create_app
from .errors import ProxyError
from .settings import ProxySettings
from .upstream import AiohttpUpstream, HttpxUpstream, Upstream

__all__ = [
    "EXCHANGE_HEADER",
    "SCENARIO_HEADER",
    "TRAJECTORY_HEADER",
    "AiohttpUpstream",
    "HttpxUpstream",
    "ProxyError",
    "ProxySettings",
    "Upstream",
    "create_app",
]
