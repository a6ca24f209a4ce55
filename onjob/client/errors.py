"""The client's one exception tree: what went wrong talking to an onjob server, with the
server's own message where it answered."""

from __future__ import annotations

from ..errors import OnjobError


class ClientError(OnjobError):
    """Talking to an onjob server failed."""


class Unreachable(ClientError):
    """No answer: nothing listens at the address, or the connection failed or timed out."""


class Refused(ClientError):
    """The server answered with an error; `status` is its HTTP status and the message is
    the one it gave (OpenAI's error shape)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
