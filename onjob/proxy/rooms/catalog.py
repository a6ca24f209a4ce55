"""What the proxy serves: `GET /v1/models`, `GET /v1/models/{model}`, `GET /openapi.json`.
Each asks the engines what they hold first; the configured aliases are listed anyway."""

from __future__ import annotations

import contextlib
import time

from litestar import Response, get
from litestar.params import FromPath

from .. import openapi
from ..errors import NotFound, UpstreamError
from ..protocol import Model, ModelList
from ..routing import Router
from ..settings import ProxySettings


def routes(settings: ProxySettings, router: Router) -> tuple:
    async def names() -> list[str]:
        with contextlib.suppress(UpstreamError):
            await router.discover()
        return router.names()

    def entry(name: str, created: int) -> Model:
        return Model(id=name, object="model", created=created, owned_by="onjob")

    @get("/v1/models")
    async def models() -> ModelList:
        known, created = await names(), int(time.time())
        return ModelList(object="list", data=[entry(name, created) for name in known])

    @get("/v1/models/{model:path}")
    async def model(model: FromPath[str]) -> Model:
        name = model.lstrip("/")
        if name not in await names():
            raise NotFound(f"The model `{name}` does not exist.", param="model")
        return entry(name, int(time.time()))

    @get("/openapi.json")
    async def openapi_document() -> Response:
        # Behind an API key like the rest (it names the models, as /v1/models does).
        return Response(openapi.document(settings, await names()), media_type="application/json")

    return models, model, openapi_document
