"""What the proxy serves: `GET /v1/models`, `GET /v1/models/{model}`, `GET /openapi.json`.
Each asks the engines what they hold first; the configured aliases are listed anyway."""

from __future__ import annotations

import contextlib
import time

from litestar import Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from .. import openapi
from ..errors import NotFound, UpstreamError
from ..protocol import Model, ModelList
from ..routing import Router
from . import Serving


async def _names(router: Router) -> list[str]:
    with contextlib.suppress(UpstreamError):
        await router.discover()
    return router.names()


def _entry(name: str, created: int) -> Model:
    return Model(id=name, object="model", created=created, owned_by="onjob")


@get("/v1/models")
async def models(serving: NamedDependency[Serving]) -> ModelList:
    known, created = await _names(serving.traffic.router), int(time.time())
    return ModelList(object="list", data=[_entry(name, created) for name in known])


@get("/v1/models/{model:path}")
async def model(model: FromPath[str], serving: NamedDependency[Serving]) -> Model:
    name = model.lstrip("/")
    if name not in await _names(serving.traffic.router):
        raise NotFound(f"The model `{name}` does not exist.", param="model")
    return _entry(name, int(time.time()))


@get("/openapi.json")
async def openapi_document(serving: NamedDependency[Serving]) -> Response:
    # Behind an API key like the rest (it names the models, as /v1/models does).
    names = await _names(serving.traffic.router)
    return Response(openapi.document(serving.settings, names), media_type="application/json")
