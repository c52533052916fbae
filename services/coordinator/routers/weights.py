"""The learner's weight announcements, relayed to workers (which hold no Redis credentials): a long poll
answered by the one watcher of services/coordinator/weights_feed.py. The router's lifespan runs that
watcher, so including the router is all the app does for it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response, status

from services.coordinator.deps import CallerDep
from services.coordinator.errors import error_docs
from services.coordinator.weights_feed import FeedNotReadyError, WeightsFeed
from shared.api import MAX_VERSION, MAX_WEIGHTS_WAIT_S, WEIGHTS_LATEST_PATH
from shared.messages import WeightsPublished


@contextlib.asynccontextmanager
async def follow_announcements(app: FastAPI) -> AsyncIterator[None]:
    coordinator = app.state.coordinator
    feed = app.state.weights_feed = WeightsFeed(coordinator.redis, coordinator.keys)
    await feed.start()
    try:
        yield
    finally:
        await feed.stop()


router = APIRouter(tags=["broadcast"], lifespan=follow_announcements)


def release_long_polls(app: FastAPI) -> None:
    """At the server's stop (services/coordinator/uvicorn_server.py): the open long polls are answered now."""
    feed: WeightsFeed | None = getattr(app.state, "weights_feed", None)  # None: the lifespan never started
    if feed is not None:
        feed.release_waiters()


def get_weights_feed(request: Request) -> WeightsFeed:
    return request.app.state.weights_feed


WeightsFeedDep = Annotated[WeightsFeed, Depends(get_weights_feed)]


@router.get(
    WEIGHTS_LATEST_PATH,
    response_model=WeightsPublished,
    responses={204: {"description": "nothing newer within wait_s"}, **error_docs(401, 503)},
)
async def latest_weights(
    _caller: CallerDep,
    feed: WeightsFeedDep,
    after_version: Annotated[
        int, Query(ge=-1, le=MAX_VERSION, description="the version the caller holds; -1: none")
    ] = -1,
    after_sha256: Annotated[
        str | None,
        Query(
            pattern=r"^[0-9a-f]{64}$",
            description="the manifest sha256 of the caller's announcement: then any other manifest is news, "
            "lower versions included (a learner resumed from an older checkpoint)",
        ),
    ] = None,
    wait_s: Annotated[float, Query(ge=0.0, le=MAX_WEIGHTS_WAIT_S, description="how long to wait for news")] = 0.0,
) -> Response:
    """The learner's newest announcement as soon as it is news to the caller (a version above
    `after_version`, or with `after_sha256` any other manifest), waiting at most `wait_s`; 204 if none
    came. A worker long-polls this with the announcement it last saw."""
    try:
        news = await feed.wait_for_news(after_version, after_sha256, wait_s)
    except FeedNotReadyError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc)) from exc
    if news is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return Response(news.json_bytes, media_type="application/json")
