"""The OpenAI requests onjob takes and the answers it gives, declared once: what the proxy
checks, reads and documents, what the local engine decodes and builds, what the log keeps
of an answer, and how the engine's request is built from a client's or a logged one.

- `chat`: `ChatCompletionRequest` and its parts, the answer `ChatCompletion` and its
  streamed `ChatCompletionChunk`; `completion`: the legacy `CompletionRequest` and its
  answer `TextCompletion`; `fields`: the bounds, hints and refusals both share, and the
  answers' common parts (`Exact`, `Usage`).
- `body`: the one rule every request body is read by (UTF-8, one JSON object, bounded
  depth, no key twice), which keeps the logged bytes and the answered request one; and
  `JsonObject`, a JSON object carried as its writer wrote it.
- `checks`: a decoded body checked against its type, a 400 naming the offending path;
  an engine's answer checked on the fields its declaration knows (`known`).
- `engine`: the engine-bound body, token ids and logprobs asked for.
- `errors`: `InvalidRequest`, the 400 both servers answer as it is.
"""

from .body import MAX_DEPTH, JsonObject, decode_body
from .chat import ChatCompletionRequest, Message
from .completion import CompletionRequest
from .engine import engine_body
from .errors import InvalidRequest

__all__ = [
    "MAX_DEPTH",
    "ChatCompletionRequest",
    "CompletionRequest",
    "InvalidRequest",
    "JsonObject",
    "Message",
    "decode_body",
    "engine_body",
]
