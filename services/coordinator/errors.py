"""The boundary policy: which failure becomes which HTTP status, with its reason in `detail`."""

from __future__ import annotations

import logging

import redis
from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from services.coordinator.worker_registry import UnknownWorkerError, WorkerDeadError
from shared.retry import REDIS_OUTAGE_ERRORS, as_redis_outage, is_redis_outage

log = logging.getLogger(__name__)


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer (FastAPI's shape; 422 carries a list of field errors instead)."""

    detail: str


def error_docs(*status_codes: int) -> dict[int | str, dict[str, object]]:
    """OpenAPI `responses=` entries for the error statuses an endpoint can answer."""
    reasons = {
        401: "missing or invalid bearer token",
        403: "the token does not allow this call",
        404: "no such worker",
        409: "the worker's state does not allow this (rejoining while draining or quarantined; releasing one not quarantined)",
        410: "the worker's lease expired: register again",
        429: "too many registrations: retry after Retry-After seconds",
        503: "Redis is unreachable, loading its data (a restart replaying its AOF) or full (at maxmemory)",
    }
    return {code: {"model": ErrorResponse, "description": reasons[code]} for code in status_codes}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(UnknownWorkerError, _unknown_worker)
    app.add_exception_handler(WorkerDeadError, _worker_dead)
    # a Redis outage (shared/retry.py): unreachable, loading its data (BusyLoadingError, a ConnectionError),
    # or at maxmemory (noeviction: it refuses writes until the trusted consumers trim what they consumed).
    # The call did nothing (a refused EXEC or script has no effect), so it is a 503 to retry, not a 500
    for outage in REDIS_OUTAGE_ERRORS:
        app.add_exception_handler(outage, _redis_unavailable)
    # the same outage replies when a path raised them as a plain ResponseError; other ones are bugs (500)
    app.add_exception_handler(redis.ResponseError, _redis_error_reply)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 naming each bad field and why, without echoing the input back: FastAPI's own answer copies
    the offending value (a 100 kB name came back whole) and fails to encode NaN or Infinity (a 500)."""
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(error.get("loc", ())), "msg": str(error.get("msg", ""))[:200], "type": error.get("type", "")}
        for error in exc.errors()[:20]
    ]
    return JSONResponse({"detail": errors}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _unknown_worker(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_404_NOT_FOUND)


async def _worker_dead(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_410_GONE)


REDIS_RETRY_AFTER_S = 1  # what a 503 for a Redis outage says to wait: a restart or an AOF replay is short


def redis_outage_detail(exc: BaseException) -> str:
    """The reason a 503 gives for a Redis outage (`shared.retry.as_redis_outage`)."""
    outage = as_redis_outage(exc) or exc
    if isinstance(outage, redis.exceptions.BusyLoadingError):
        return f"redis is loading its data (restarted, replaying its AOF): {outage}"
    if isinstance(outage, redis.exceptions.OutOfMemoryError):
        return f"redis is full (at maxmemory): {outage}"
    return f"redis is unreachable: {outage}"


async def _redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # callers retry. Writes are single transactions or scripts, so a call that did land before the
    # connection broke left consistent state (at worst an orphan registration, which simply expires).
    detail = redis_outage_detail(exc)
    log.warning("%s %s: %s", request.method, request.url.path, detail)
    return JSONResponse(
        {"detail": detail},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(REDIS_RETRY_AFTER_S)},
    )


async def _redis_error_reply(request: Request, exc: Exception) -> JSONResponse:
    if not is_redis_outage(exc):
        raise exc  # a wrong command or a failing script: a bug, answered 500 with its traceback logged
    return await _redis_unavailable(request, exc)
