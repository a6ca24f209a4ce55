"""The engine's exception tree; each maps to an OpenAI-shaped error body and status."""

from __future__ import annotations

from ..openai_errors import OpenAIError


class EngineError(OpenAIError):
    pass


class BadRequest(EngineError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(EngineError):
    status = 401
    type = "authentication_error"


class Forbidden(EngineError):
    status = 403
    type = "permission_error"


class NotFound(EngineError):
    status = 404
    type = "not_found_error"


class GenerationFailed(EngineError):
    """The model failed while generating (the batch it was in is dropped, the engine goes on)."""
