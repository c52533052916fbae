"""A small typed client for the coordinator's worker-facing REST API (bodies: shared/api.py).

Errors form one family so callers can pick a policy per kind:
- CoordinatorUnavailableError: network error, timeout or 5xx; retry with backoff (`shared.retry.Backoff`).
- WorkerExpiredError: 410, the coordinator declared this worker dead (or, WorkerUnknownError, 404 on a
  heartbeat: it has no record of it); register again.
- RegistrationThrottledError (a CoordinatorUnavailableError): 429, registrations come too fast; retry
  after its `retry_after_s` (the answer's Retry-After).
- IdentityRejectedError (a CoordinatorRejectedError): 403 on a rejoin, the token is not the previous
  id's; register as a new worker.
- CoordinatorRejectedError: any other non-success answer or a malformed body; a bug or a misconfiguration
  (bad token, wrong join token, bad request), not retried.
- CoordinatorUntrustedError (a CoordinatorRejectedError): the server's certificate failed verification against
  the run CA or the pinned fingerprint (shared/tls.py); nothing was sent, not retried.

`verify` is httpx's, from `CoordinatorTrust.verify_for(url)` (shared/tls.py): every client of the coordinator
here (this one, work_client.py, announcement_client.py, relay_sources.py) is built with the same value.
"""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from shared.api import (
    JOIN_TOKEN_HEADER,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterWorkerRequest,
    RegisterWorkerResponse,
    StalenessResponse,
)
from shared.tls import Verify, is_verification_failure

B = TypeVar("B", bound=BaseModel)


class CoordinatorError(RuntimeError):
    """Base of everything this client raises."""


class CoordinatorUnavailableError(CoordinatorError):
    """The coordinator could not be reached or failed (5xx); try again later."""


class WorkerExpiredError(CoordinatorError):
    """410: this worker's lease expired and it was declared dead; it must register again."""


class WorkerUnknownError(WorkerExpiredError):
    """404 on a heartbeat: the coordinator has no record of this worker (removed by an admin, or its
    Redis lost the run state); like an expiry, the worker must register again."""


class RegistrationThrottledError(CoordinatorUnavailableError):
    """429: the coordinator admits registrations at a bounded rate; try again after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TokenRefusedError(CoordinatorUnavailableError):
    """401: the coordinator does not know the token (yet): the worker is registering again, and the next
    token is the new one. Retried like an outage (the work API and the weights long poll raise it)."""


class CoordinatorRejectedError(CoordinatorError):
    """The coordinator refused the request (4xx other than 410) or answered something unreadable."""


class IdentityRejectedError(CoordinatorRejectedError):
    """403 on a rejoin: the token presented is not the previous worker id's."""


class CoordinatorUntrustedError(CoordinatorRejectedError):
    """The coordinator's TLS certificate failed verification (the run CA, the pin): the connection was closed in
    its handshake, before a request, so no token was sent."""


MAX_RETRY_AFTER_S = 60.0  # a Retry-After beyond this (or unreadable) is taken as this


class CoordinatorClient:
    def __init__(
        self,
        base_url: str,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        join_token: str | None = None,
        verify: Verify = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.join_token = join_token  # sent with every registration (None: the coordinator's is open)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport, verify=verify)

    def register(self, request: RegisterWorkerRequest, previous_token: str | None = None) -> RegisterWorkerResponse:
        """Join the run; rejoining as `request.previous_worker_id`, send its `previous_token`."""
        headers = {} if self.join_token is None else {JOIN_TOKEN_HEADER: self.join_token}
        if previous_token is not None:
            headers |= _bearer(previous_token)
        response = self._send("POST", "/v1/workers", json=request.model_dump(mode="json"), headers=headers)
        if response.status_code == 429:
            raise RegistrationThrottledError(
                f"registration: HTTP 429: {response.text[:200]}", _retry_after_s(response.headers.get("Retry-After"))
            )
        if response.status_code == 403 and request.previous_worker_id is not None:
            raise IdentityRejectedError(f"rejoin as {request.previous_worker_id}: HTTP 403: {response.text[:200]}")
        return parse_body(response, 201, RegisterWorkerResponse)

    def heartbeat(self, worker_id: str, token: str, request: HeartbeatRequest) -> HeartbeatResponse:
        response = self._send(
            "POST", f"/v1/workers/{worker_id}/heartbeat", json=request.model_dump(mode="json"), headers=_bearer(token)
        )
        if response.status_code == 404:
            raise WorkerUnknownError(f"heartbeat of {worker_id}: HTTP 404: {response.text[:200]}")
        return parse_body(response, 200, HeartbeatResponse)

    def deregister(self, worker_id: str, token: str) -> None:
        response = self._send("DELETE", f"/v1/workers/{worker_id}", headers=_bearer(token))
        expect_status(response, 204)

    def staleness(self, policy_version: int) -> StalenessResponse:
        response = self._send("GET", "/v1/staleness", params={"policy_version": policy_version})
        return parse_body(response, 200, StalenessResponse)

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise transport_error(f"{method} {self.base_url}{path}", exc) from exc


def transport_error(what: str, exc: httpx.HTTPError) -> CoordinatorError:
    """The family's member for a request that got no answer: a certificate that failed verification is
    CoordinatorUntrustedError (a misconfiguration or an impostor: never retried); connect and read errors and
    timeouts are CoordinatorUnavailableError (transient from here)."""
    if is_verification_failure(exc):
        return CoordinatorUntrustedError(f"{what}: the coordinator's TLS certificate failed verification: {exc}")
    return CoordinatorUnavailableError(f"{what}: {type(exc).__name__}: {exc}")


def _retry_after_s(value: str | None) -> float:
    """Retry-After in seconds (the HTTP-date form is not used by the coordinator: taken as the maximum)."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        return MAX_RETRY_AFTER_S
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S) if seconds == seconds else MAX_RETRY_AFTER_S


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def expect_status(response: httpx.Response, status: int, *, retry_refused_token: bool = False) -> None:
    """Raise the error family's member for any answer but `status`: 410 expired, 5xx unavailable, 401 a refused
    token (retried, when `retry_refused_token`: calls made with a token the worker renews by registering)."""
    if response.status_code == status:
        return
    what = f"{response.request.method} {response.request.url}: HTTP {response.status_code}: {response.text[:200]}"
    if response.status_code == 401 and retry_refused_token:
        raise TokenRefusedError(what)
    if response.status_code == 410:
        raise WorkerExpiredError(what)
    if response.status_code >= 500:
        raise CoordinatorUnavailableError(what)
    raise CoordinatorRejectedError(what)


def parse_body(response: httpx.Response, status: int, body_type: type[B], *, retry_refused_token: bool = False) -> B:
    """`expect_status`, then the body as `body_type` (malformed: CoordinatorRejectedError)."""
    expect_status(response, status, retry_refused_token=retry_refused_token)
    try:
        return body_type.model_validate_json(response.content)
    except ValidationError as exc:
        raise CoordinatorRejectedError(f"{response.request.url}: malformed {body_type.__name__}: {exc}") from exc
