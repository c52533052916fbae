"""The boundary policy: which failure becomes which HTTP status, with its reason in `detail`."""

from __future__ import annotations

import logging

import redis
from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from services.coordinator.worker_registry import UnknownWorkerError, WorkerDeadError

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
        503: "Redis is unreachable (or full: at maxmemory)",
    }
    return {code: {"model": ErrorResponse, "description": reasons[code]} for code in status_codes}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(UnknownWorkerError, _unknown_worker)
    app.add_exception_handler(WorkerDeadError, _worker_dead)
    app.add_exception_handler(redis.ConnectionError, _redis_unreachable)
    app.add_exception_handler(redis.TimeoutError, _redis_unreachable)
    # Redis at maxmemory (noeviction) refuses writes until the trusted consumers trim what they consumed:
    # the call did nothing (a refused EXEC or script has no effect), so it is a 503 to retry, not a 500
    app.add_exception_handler(redis.exceptions.OutOfMemoryError, _redis_unreachable)


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


async def _redis_unreachable(request: Request, exc: Exception) -> JSONResponse:
    # callers retry. Writes are single transactions or scripts, so a call that did land before the
    # connection broke left consistent state (at worst an orphan registration, which simply expires).
    log.warning("%s %s: redis unreachable: %s", request.method, request.url.path, exc)
    return JSONResponse(
        {"detail": f"redis is unreachable: {exc}"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": "1"},
    )
