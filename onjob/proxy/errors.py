"""The proxy's exception tree. Each maps to an OpenAI-shaped error body and status.

The engine client's failures are raised as `UpstreamUnreachable` (`NotConnected` when no
connection was made), `UpstreamTimeout`, `StreamCut` and `AnswerTooLarge` in `lean.py`,
and nowhere else.
"""

from __future__ import annotations

from typing import Any

from ..openai_errors import OpenAIError
from ..openai_handlers import openai_error


class ProxyError(OpenAIError):
    pass


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"


class Forbidden(ProxyError):
    status = 403
    type = "permission_error"


class UnsupportedMediaType(ProxyError):
    status = 415
    type = "invalid_request_error"


class Conflict(ProxyError):
    status = 409
    type = "invalid_request_error"


class NotFound(ProxyError):
    status = 404
    type = "not_found_error"


class PrimaryUnreachable(ProxyError):
    """A proxy-only process cannot reach the server it forwards database requests to."""

    status = 503
    type = "service_unavailable"


class LogUnavailable(ProxyError):
    """The log's DuckLake catalog does not answer (`collector.CatalogUnreachable`): a
    request that must read it (a chained call, feedback, the admin API) may succeed after
    `Retry-After`. Requests that only answer are served meanwhile."""

    status = 503
    type = "service_unavailable"
    retry_after_s = 5


def log_unavailable(request: Any, exc: Exception) -> Any:
    """The handler the proxy's and the admin's routes install for `CatalogUnreachable`."""
    return openai_error(request, LogUnavailable(str(exc)))


class UpstreamError(ProxyError):
    """The engine could not give an answer."""


class UpstreamUnreachable(UpstreamError):
    status = 502
    type = "bad_gateway"


class NotConnected(UpstreamUnreachable):
    """No connection to the engine could be made (refused, no route): nothing was sent."""


class HungUp(UpstreamUnreachable):
    """The engine closed the connection before its answer began: its process is dying (a
    killed process's listening socket accepts, then resets what it accepted) or fell over
    on this request."""


class EngineUnavailable(UpstreamError):
    """Every engine the pool checks is down (its process died, or is being restarted):
    the client's retry, after `Retry-After`, finds it back."""

    status = 503
    type = "service_unavailable"
    retry_after_s = 2


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "gateway_timeout"


class StreamCut(UpstreamError):
    """The engine closed the connection in the middle of an answer."""

    status = 502
    type = "bad_gateway"


class AnswerTooLarge(UpstreamError):
    """The engine's answer is past `proxy.max_answer_bytes`: the connection is closed, and
    nothing more of it is held in memory."""

    status = 502
    type = "bad_gateway"


class MalformedAnswer(UpstreamError):
    """The engine answered 200 with a body that is not a chat completion."""

    status = 502
    type = "bad_gateway"


class UpstreamStatus(UpstreamError):
    """The engine answered with an error status; its body is passed on as it is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"engine answered {status}: {body[:500].decode(errors='replace')}")
        self.status = status
        self.raw = body
        self.content_type = content_type


class AdapterUnavailable(UpstreamError):
    """No engine serves the checkpoint's adapter right now (a restarted engine forgot its
    runtime-loaded adapters; it is being loaded again). Answered rather than sent to the
    base model under the checkpoint's name."""

    status = 503
    type = "service_unavailable"
    retry_after_s = 1  # the openai client waits this long and retries
