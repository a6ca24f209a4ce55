"""The protocol's one error: a request that is not one its API accepts."""

from __future__ import annotations

from ..openai_errors import OpenAIError


class InvalidRequest(OpenAIError):
    """A 400 naming the offending field's path (`param`): the proxy and the local engine
    both answer it as it is, through their OpenAI error handlers."""

    status = 400
    type = "invalid_request_error"
