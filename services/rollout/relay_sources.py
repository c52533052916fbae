"""Asking the coordinator where to fetch weights from (GET /v1/workers/{id}/parent).

Policy at this boundary: the plan is advice. If the coordinator cannot be reached, answers an error,
or this worker is not registered (yet, or any more), the answer is "the learner only" and the fetch
goes on; it is asked again whenever every holder it named has failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from shared.api import ParentResponse
from shared.tls import Verify

log = logging.getLogger(__name__)


class CoordinatorParents:
    """`parents(learner_url)` -> holders to stream from, best first: the assigned parent (the learner for
    a seed), then the plan's fallbacks. Callable from the weights-sync thread."""

    def __init__(
        self, coordinator_url: str, worker_id: Callable[[], str], timeout_s: float = 5.0, *, verify: Verify = True
    ) -> None:
        self.coordinator_url = coordinator_url.rstrip("/")
        self.worker_id = worker_id  # raises while not registered; the id changes on re-registration
        self.last: ParentResponse | None = None
        self._http = httpx.Client(base_url=self.coordinator_url, timeout=timeout_s, verify=verify)

    def __call__(self, learner_url: str) -> list[str]:
        try:
            worker_id = self.worker_id()
            response = self._http.get(f"/v1/workers/{worker_id}/parent")
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
            parent = ParentResponse.model_validate_json(response.content)
        except (
            httpx.HTTPError,
            ValidationError,
            ValueError,
            RuntimeError,
        ) as exc:  # NotRegisteredError is a RuntimeError
            log.warning("no relay parent from %s (%s): fetching from the learner", self.coordinator_url, exc)
            return [learner_url]
        if parent != self.last:
            log.info(
                "relay parent %s (%s), depth %d, %d fallbacks",
                parent.parent_id,
                parent.parent_url or learner_url,
                parent.depth,
                len(parent.fallback_urls),
            )
        self.last = parent
        return [parent.parent_url or learner_url, *parent.fallback_urls]

    def close(self) -> None:
        self._http.close()
