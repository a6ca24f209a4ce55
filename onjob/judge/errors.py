"""The judge's exception tree. litellm's and httpx's errors are translated here, once."""

from __future__ import annotations

import httpx

from ..errors import OnjobError


class JudgeError(OnjobError):
    pass


class ConfigError(JudgeError):
    """A setting cannot work (a reward function that does not import, say)."""


class SamplingFailed(JudgeError):
    """The engine could not re-sample a logged request. `permanent`: asking again would fail
    the same way (a 4xx, an answer without token ids), so the turn is marked failed;
    otherwise (down, slow, 5xx) it waits for the next pass."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class JudgeUnavailable(JudgeError):
    """The judge model did not answer (timeout, connection, 429, 5xx): worth another try."""


class JudgeRefused(JudgeError):
    """The judge's API rejected the call (4xx): another try would fail the same way."""


class InvalidAnswer(JudgeError):
    """The judge answered, but not with one valid score per candidate."""


class RewardFnFailed(JudgeError):
    """A user reward function raised or returned something that is not a finite number."""


def from_litellm(exc: Exception) -> JudgeError:
    import litellm

    status = getattr(exc, "status_code", None)
    if isinstance(exc, litellm.Timeout):
        return JudgeUnavailable(f"the judge timed out: {_short(exc)}")
    if isinstance(exc, litellm.APIConnectionError) or _caused_by(exc, httpx.TransportError):
        # litellm reports a refused connection as a 500: the cause says what happened.
        return JudgeUnavailable(f"cannot reach the judge: {_short(exc)}")
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return JudgeRefused(f"the judge's API refused the call ({status}): {_short(exc)}")
    return JudgeUnavailable(f"the judge failed ({status or type(exc).__name__}): {_short(exc)}")


def from_httpx(exc: httpx.HTTPError) -> SamplingFailed:
    if isinstance(exc, httpx.TimeoutException):
        return SamplingFailed(f"the engine timed out: {exc!r}")
    return SamplingFailed(f"cannot reach the engine: {exc!r}")


def _caused_by(exc: BaseException, kind: type) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _short(exc: Exception, limit: int = 300) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"
