"""The proxy's routes, a room each: `chat` (chat and legacy completions), `responses` (the
Responses API and its stored responses), `catalog` (models and the OpenAPI document),
`feedback`. Each room's `routes(...)` returns its Litestar handlers; the hot ones are also
served by `front.py` as bare ASGI, through the same functions."""
