"""The OpenAI-compatible front door: routes each request to its checkpoint, forwards it to
the engine (logprobs and token ids always on), answers in OpenAI's exact shape, and
hands the exchange to the collector without waiting on disk.

`create_app(settings, upstream=..., collector=...)` builds the Litestar app;
`LeanUpstream` is the client to the engine (any object with `Upstream`'s two methods
will do: the tests hand in one over an httpx `MockTransport`). `Router` holds each alias's
live and canary arms (`X-Onjob-Arm` pins one for a request).

What each module holds:

the Litestar app, composed from its rooms (`app.py`; `rooms/`: `chat.py` chat and legacy
completions, `responses.py` the Responses API and stored responses, `catalog.py` models
and the OpenAPI document, `feedback.py`; each handler a module-level function taking the
rooms' shared `Serving` as its dependency, the hot ones called by the front with the
same), forwarding one exchange in named steps: the attempt, a failed canary answered by
live, the refusal logged like any exchange (`traffic.py`), the one relay for every
streamed shape, chat chunks or the Responses API's events (`stream.py`), who may call
what, decided before any handler runs: API keys, the admin key, `Host` and `Origin` of
pages of other sites, JSON-only admin bodies, as the front's check and one Litestar
guard per router, leaving the `Caller` in the request's scope (`auth.py`), its hot
routes (chat, completions, responses) answered as bare ASGI in front of Litestar's
router by the same handlers, with Litestar's answers and errors (`front.py`), request
validation by `onjob.protocol` with this server's bounds (at most `proxy.max_messages`
messages, refused before any is hashed), carried typed after its check beside the body
as sent (`Asked`), and the exchange record, every field of OpenAI's chat request passed
on as sent, honoured or refused by name (`exchange.py`), the
Responses API translated into chat and back, its typed stream events, stored Responses
on the exchange row (`responses.py`), the one engine client, a lean keep-alive HTTP/1.1
client over httptools that refuses what h11 refuses: bytes past a complete answer, a
whole answer past `proxy.answer_timeout_s`, a body past `proxy.max_answer_bytes`
(`lean.py`), behind a two-method interface tests can fill at the HTTP boundary
(`upstream.py`), its errors the proxy's (`errors.py`), the engines behind it: the least
busy healthy one per request, health checks, a restarted engine kept out until its
adapters are loaded again, unless the engines load adapters by name themselves
(`proxy.engines_resolve_adapters`) (`pool.py`), arm choice, per lineage: the request's
API key picks its tenant's lineage of the alias, else the shared one (`routing.py`),
tenants and their lineages, each lineage's keys as a `KeyScope` (`tenants.py`), what a
proxy-only process shares with the primary: the routing through `routing.json` in the
spool directory, and the requests that need the database forwarded (`replicas.py`), SSE
(`sse.py`), the Responses API and the proxy's own routes, one declaration each: the
Responses request checked against the type it is documented with, the Response object
and a stored Response built as their Structs (`protocol.py`; chat and legacy
completions, requests and answers, are `onjob.protocol`'s: an engine's answer read as
their declarations, a streamed chat event field by field), the OpenAPI document from
them with this server's bounds, its paths from a table of typed `Route`s built with
Litestar's OpenAPI types (`openapi.py`), spans (`telemetry.py`), `GET /metrics` in
Prometheus' text format: each exchange counted where its spool line is written (lineage,
arm, status, the latency the line records), the engines, the routing and the collector's
counters read at each scrape, in a registry of the app's own, behind `proxy.metrics_key`
or the admin key; a proxy-only process counts nothing and forwards the scrape to the
primary (`metrics.py`)"""

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
