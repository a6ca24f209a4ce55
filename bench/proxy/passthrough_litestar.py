"""A bare Litestar + uvicorn passthrough over the aiohttp client, no parsing, no shaping,
no logging: the floor of the stack onjob served its traffic with until its hot routes
left Litestar's router (`proxy/front.py`) and aiohttp's client (`proxy/lean.py`). It
cost ~237 µs of CPU per request at c64 against ~118 for a bare ASGI relay on uvicorn
over the same client: why they left.

    python -m bench.proxy.passthrough_litestar --port 9003 --upstream http://127.0.0.1:9001/v1
"""

from __future__ import annotations

import argparse

import aiohttp
import uvicorn
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream


def app(upstream: str) -> Litestar:
    session: aiohttp.ClientSession | None = None

    async def start() -> None:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024))

    async def stop() -> None:
        await session.close()

    @get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request) -> Response | Stream:
        body = await request.body()
        headers = {"Content-Type": "application/json"}
        r = await session.post(f"{upstream}/chat/completions", data=body, headers=headers)
        if r.content_type != "text/event-stream":
            data = await r.read()
            r.release()
            return Response(data, status_code=r.status, media_type="application/json")

        async def relay():
            try:
                async for data in r.content.iter_any():
                    yield data
            finally:
                r.release()

        return Stream(relay(), media_type="text/event-stream")

    return Litestar([health, chat], on_startup=[start], on_shutdown=[stop], openapi_config=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the engine's base URL (…/v1)")
    args = parser.parse_args()
    uvicorn.run(
        app(args.upstream.rstrip("/")),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
