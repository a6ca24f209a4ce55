"""The OpenAI-compatible front door: routes each request to its checkpoint, forwards it to
the engine (logprobs and token ids always on), answers in OpenAI's exact shape, and
hands the exchange to the collector without waiting on disk.

`create_app(settings, upstream=..., collector=...)` builds the Litestar app;
`LeanUpstream` is the client to the engine (any object with `Upstream`'s two methods
will do: the tests hand in one over an httpx `MockTransport`). `Router` holds each alias's
live and canary arms (`X-Onjob-Arm` pins one for a request).
"""

from .app import ARM_HEADER, EXCHANGE_HEADER, SCENARIO_HEADER, TRAJECTORY_HEADER, create_app
from .errors import ProxyError
from .lean import LeanUpstream
from .routing import Router
from .settings import Canary, ProxySettings
from .upstream import Upstream, UpstreamResponse

__all__ = [
    "ARM_HEADER",
    "EXCHANGE_HEADER",
    "SCENARIO_HEADER",
    "TRAJECTORY_HEADER",
    "Canary",
    "LeanUpstream",
    "ProxyError",
    "ProxySettings",
    "Router",
    "Upstream",
    "UpstreamResponse",
    "create_app",
]
