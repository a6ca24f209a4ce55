"""OpenAI's error shape, and Litestar handlers that answer in it (the proxy and the local
engine both speak it)."""

from __future__ import annotations

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException

from .errors import OnjobError

log = logging.getLogger("onjob")

_HTTP_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
}


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

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def openai_error(_: Request, exc: OpenAIError) -> Response:
    return Response(exc.body(), status_code=exc.status, headers=exc.headers())


def error_body(message: str, type_: str, status: int, param: str | None = None) -> Error:
    return Error(error=ErrorDetail(message=message, type=type_, param=param, code=status))


def http_error(_: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    type_ = _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return Response(error_body(exc.detail, type_, status), status_code=status)


def internal_error(_: Request, exc: Exception) -> Response:
    log.exception("request failed", exc_info=exc)
    return Response(
        error_body(f"Internal error: {type(exc).__name__}: {exc}", "internal_server_error", 500),
        status_code=500,
    )


HANDLERS = {OpenAIError: openai_error, HTTPException: http_error, Exception: internal_error}
