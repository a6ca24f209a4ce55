"""`POST /v1/feedback`: a user's signal on an exchange or a conversation of their own key."""

from __future__ import annotations

import time

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency

from ...collector import FeedbackRecord, queries
from ...collector.ids import new_id
from ...collector.trajectories import scoped
from .. import protocol
from ..auth import caller
from ..errors import BadRequest, NotFound
from ..traffic import Traffic
from . import Serving


@post("/v1/feedback", status_code=200)
async def feedback(
    request: Request, serving: NamedDependency[Serving]
) -> Response | protocol.FeedbackRecorded:
    if serving.forward is not None:
        return await serving.forward(request)  # checked against the primary's database
    traffic = serving.traffic
    api_key_id = caller(request).api_key_id
    fb = _decode(await request.body())
    trajectory_id = await _owned(traffic, fb, api_key_id)
    record = FeedbackRecord(
        id=new_id("fb_"),
        ts=time.time(),
        exchange_id=fb.exchange_id,
        trajectory_id=trajectory_id,
        api_key_id=api_key_id,
        value=fb.value,
        comment=fb.comment,
        metric=fb.metric,
    )
    traffic.collector.log(record)
    return protocol.FeedbackRecorded(object="feedback", **msgspec.structs.asdict(record))


def _decode(raw: bytes) -> protocol.Feedback:
    try:
        fb = msgspec.json.decode(raw, type=protocol.Feedback)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"Invalid feedback: {exc}") from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Malformed JSON body: {exc}") from exc
    if not (fb.exchange_id or fb.trajectory_id):
        raise BadRequest("Feedback needs an `exchange_id` or a `trajectory_id`.")
    return fb


async def _owned(traffic: Traffic, fb: protocol.Feedback, api_key_id: str | None) -> str | None:
    """The feedback's trajectory, once both its ids are found to be the key's own. Another
    key's exchange or conversation is answered as missing: its id stays secret. A named
    conversation is the key's own name for it (as when chatting)."""
    trajectory_id = scoped(fb.trajectory_id, api_key_id) if fb.trajectory_id else None
    if fb.exchange_id:
        row = await traffic.lookup(queries.exchange, fb.exchange_id)
        if row is None or row.api_key_id != api_key_id:
            raise NotFound(f"No exchange `{fb.exchange_id}`.", param="exchange_id")
        trajectory_id = trajectory_id or row.trajectory_id
    if fb.trajectory_id:
        owner = await traffic.lookup(queries.trajectory_owner, trajectory_id)
        if owner is None or owner.api_key_id != api_key_id:
            raise NotFound(f"No trajectory `{fb.trajectory_id}`.", param="trajectory_id")
    return trajectory_id
