"""OpenAI's error shape, `{"error": {...}}`, and the root of the errors answered in it
(the proxy and the local engine both speak it; `openai_handlers` answers them over
Litestar). No HTTP framework here: the request protocol and the collector import it."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from .errors import OnjobError


class ErrorDetail(msgspec.Struct, kw_only=True):
    """onjob's own errors carry all four fields; an engine's error is passed on as sent."""

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class Error(msgspec.Struct, kw_only=True):
    error: ErrorDetail


class OpenAIError(OnjobError):
    """An error answered as `{"error": {...}}` with its HTTP status; each package's
    exception tree (the proxy's, the engine's) grows from it."""

    status = 500
    type = "internal_server_error"
    retry_after_s: int | None = None  # said as `Retry-After`: the same request may succeed

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> Error:
        return error_body(self.message, self.type, self.status, self.param)

    def headers(self) -> Mapping[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def error_body(message: str, type_: str, status: int, param: str | None = None) -> Error:
    return Error(error=ErrorDetail(message=message, type=type_, param=param, code=status))
