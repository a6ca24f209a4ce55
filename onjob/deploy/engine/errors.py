"""The engine's exception tree; each maps to an OpenAI-shaped error body and status."""

from __future__ import annotations


class EngineError(Exception):
    status = 500
    type = "internal_server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict:
        return error_body(self.message, self.type, self.status, self.param)


class BadRequest(EngineError):
    status = 400
    type = "invalid_request_error"


class NotFound(EngineError):
    status = 404
    type = "not_found_error"


class GenerationFailed(EngineError):
    """The model failed while generating (the batch it was in is dropped, the engine goes on)."""


def error_body(message: str, type_: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}
