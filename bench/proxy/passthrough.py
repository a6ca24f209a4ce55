"""Python's floor for an HTTP proxy: a bare aiohttp passthrough, no parsing, no logging.

Forwards `POST /v1/chat/completions` byte for byte to the engine and relays the
answer (chunk by chunk for a stream), on uvloop when installed. Anything a real
proxy does (authentication, routing, shaping, logging) costs on top of this.

    python -m bench.proxy.passthrough --port 9002 --upstream http://127.0.0.1:9001/v1
"""

from __future__ import annotations

import argparse

from aiohttp import ClientSession, TCPConnector, web


def app(upstream: str) -> web.Application:
    session: ClientSession | None = None

    async def start(_: web.Application) -> None:
        nonlocal session
        session = ClientSession(connector=TCPConnector(limit=1024))

    async def stop(_: web.Application) -> None:
        await session.close()

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": "application/json"}
        async with session.post(f"{upstream}/chat/completions", data=body, headers=headers) as r:
            if r.content_type != "text/event-stream":
                return web.Response(body=await r.read(), status=r.status, headers=headers)
            relayed = web.StreamResponse(status=r.status)
            relayed.content_type = "text/event-stream"
            await relayed.prepare(request)
            async for data in r.content.iter_any():
                await relayed.write(data)
            await relayed.write_eof()
            return relayed

    application = web.Application()
    application.on_startup.append(start)
    application.on_cleanup.append(stop)
    application.router.add_get("/health", health)
    application.router.add_post("/v1/chat/completions", chat)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the engine's base URL (…/v1)")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
