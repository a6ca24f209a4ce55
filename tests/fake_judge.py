"""A scripted OpenAI-compatible judge: a real HTTP server on loopback (the outside boundary
of a hosted judge API), whose answers a test scripts per call.

`FakeJudge(script)`: `script(n, body)` gets the call number (1-based) and the request
body and returns `(status, content)`: content is the assistant's text for a 200, or
the error body otherwise; a `float` status means "sleep that long, then answer 200".
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CANDIDATE = re.compile(r'<candidate id="(\d+)">\n(.*?)\n</candidate>', re.DOTALL)


def candidates(body: dict) -> dict[int, str]:
    """The candidates the judge was shown: id -> the text of the block."""
    return {int(i): text for i, text in CANDIDATE.findall(body["messages"][-1]["content"])}


def scores_json(scores: dict[int, float]) -> str:
    return json.dumps(
        {"scores": [{"id": str(i), "explanation": f"c{i}", "score": s} for i, s in scores.items()]}
    )


class FakeJudge:
    def __init__(self, script: Callable[[int, dict], tuple]) -> None:
        self.script = script
        self.calls: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                judge.calls.append(body)
                status, content = judge.script(len(judge.calls), body)
                if isinstance(status, float):
                    time.sleep(status)
                    status = 200
                if status == 200:
                    payload = {
                        "id": f"judge-{len(judge.calls)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": content},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": 100,
                            "completion_tokens": 20,
                            "total_tokens": 120,
                        },
                    }
                else:
                    payload = {"error": {"message": content, "type": "server_error"}}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeJudge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
