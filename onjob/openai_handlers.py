"""Litestar exception handlers that answer in OpenAI's error shape (`openai_errors`): the
proxy's app and the local engine's install `HANDLERS`."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException

from .openai_errors import OpenAIError, error_body

log = logging.getLogger("onjob")

_HTTP_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
}


def openai_error(_: Request, exc: OpenAIError) -> Response:
    return Response(exc.body(), status_code=exc.status, headers=exc.headers())


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
