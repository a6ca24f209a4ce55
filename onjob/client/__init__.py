"""A small client for a running `onjob serve`: users' feedback with named metrics, the
checkpoints, canary, promote and roll back, the loop's pause, read-only SQL, exports and
status; sync (`Client`) and async (`AsyncClient`), typed, used by the CLI itself."""

from .client import AsyncClient, Client
from .errors import ClientError, Refused, Unreachable

__all__ = ["AsyncClient", "Client", "ClientError", "Refused", "Unreachable"]
