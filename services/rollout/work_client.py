"""The worker's side of the coordinator's work API (contract: shared/work_api.py): lease tasks, hand back
groups, give back tasks it cannot serve. The worker holds no Redis credentials; this is its only way to
the tasks and the rollouts.

Errors are the family of services/rollout/coordinator_client.py, so the worker keeps one policy:
- CoordinatorUnavailableError: network error, timeout, 5xx, or 401 while the worker registers again
  (the next call carries the new token); retry with backoff. Unanswered leases expire and are reissued,
  so nothing is lost by waiting.
- WorkerExpiredError: 410, this worker is dead to the run; its membership registers it again.
- CoordinatorRejectedError: any other refusal; a bug or a misconfiguration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx

from services.rollout.coordinator_client import expect_status, parse_body, transport_error
from shared.messages import RolloutGroup
from shared.tls import Verify
from shared.work_api import (
    FAILURES_PATH,
    LEASE_PATH,
    MAX_ERROR_CHARS,
    MAX_GROUP_BYTES,
    MAX_GROUPS_PER_SUBMISSION,
    MAX_SUBMISSION_BYTES,
    MSGPACK_CONTENT_TYPE,
    ROLLOUTS_PATH,
    SUBMISSION_OVERHEAD_BYTES,
    SUBMITTED_GROUP_OVERHEAD_BYTES,
    LeaseRequest,
    LeaseResponse,
    Refusal,
    SubmitResponse,
    SubmittedGroup,
    TaskFailure,
    WorkSubmission,
)


class WorkClient:
    """`token()`: the worker's current bearer token (it changes when the worker registers again)."""

    def __init__(
        self,
        coordinator_url: str,
        token: Callable[[], str],
        run_id: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        verify: Verify = True,
    ) -> None:
        self.base_url = coordinator_url.rstrip("/")
        self.token = token
        self.run_id = run_id
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport, verify=verify)

    def lease(self, max_groups: int, *, policy_version: int | None = None, max_eval_groups: int = 0) -> LeaseResponse:
        """Up to `max_groups` tasks, maybe none (then back off before asking again). With `policy_version` (the
        engine's), first up to `max_eval_groups` eval tasks of exactly that version (TaskGroup.eval_version)."""
        request = LeaseRequest(max_groups=max_groups, policy_version=policy_version, max_eval_groups=max_eval_groups)
        body = request.model_dump(mode="json")
        return parse_body(self._send("POST", LEASE_PATH, json=body), 200, LeaseResponse, retry_refused_token=True)

    def submit(self, groups: Sequence[tuple[str, RolloutGroup]], *, eval_version: int | None = None) -> SubmitResponse:
        """Answer leases with (lease id, group); as many requests as the body limit needs, their answers merged.
        A group over MAX_GROUP_BYTES is not sent: its task is reported failed, and it is listed as refused.
        `eval_version`: these answer eval leases of that version (each names it)."""
        accepted: list[str] = []
        refused: list[Refusal] = []
        fitting: list[SubmittedGroup] = []
        for lease_id, group in groups:
            encoded = group.encode()
            if len(encoded) <= MAX_GROUP_BYTES:
                fitting.append(SubmittedGroup(lease_id=lease_id, group=encoded, eval_version=eval_version))
                continue
            reason = f"the group is {len(encoded)} bytes, over the work API's limit of {MAX_GROUP_BYTES}"
            # the task cannot be answered by this worker: give it back
            self.report_failure(lease_id, reason, eval_version=eval_version)
            refused.append(Refusal(lease_id=lease_id, reason=reason))
        for chunk in split_submissions(fitting):
            payload = WorkSubmission(run_id=self.run_id, groups=chunk).encode()
            response = self._send(
                "POST", ROLLOUTS_PATH, content=payload, headers={"Content-Type": MSGPACK_CONTENT_TYPE}
            )
            answer = parse_body(response, 200, SubmitResponse, retry_refused_token=True)
            accepted += answer.accepted
            refused += answer.refused
        return SubmitResponse(accepted=accepted, refused=refused)

    def report_failure(self, lease_id: str, error: str, *, eval_version: int | None = None) -> bool:
        """Give back a task this worker cannot serve (dead-lettered, never reissued; an eval lease of
        `eval_version` goes back to that version's other workers, without penalty). False: the lease was no
        longer ours (it expired and went to another worker)."""
        failure = TaskFailure(lease_id=lease_id, error=error[:MAX_ERROR_CHARS] or "error", eval_version=eval_version)
        body = failure.model_dump(mode="json")
        response = self._send("POST", FAILURES_PATH, json=body)
        if response.status_code == 409:
            return False
        expect_status(response, 204, retry_refused_token=True)
        return True

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, *, headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
        headers = {**(headers or {}), "Authorization": f"Bearer {self.token()}"}
        try:
            return self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:  # transient, unless the certificate failed verification
            raise transport_error(f"{method} {self.base_url}{path}", exc) from exc


def split_submissions(groups: list[SubmittedGroup]) -> Iterator[list[SubmittedGroup]]:
    """Consecutive runs of groups that fit one submission (count and bytes). The coordinator's limit is the
    run's (shared/work_api.py max_submission_bytes): never under what these hold when each group is one this
    run's honest workers can produce."""
    chunk: list[SubmittedGroup] = []
    num_bytes = SUBMISSION_OVERHEAD_BYTES
    for group in groups:
        size = len(group.group) + SUBMITTED_GROUP_OVERHEAD_BYTES
        if chunk and (len(chunk) == MAX_GROUPS_PER_SUBMISSION or num_bytes + size > MAX_SUBMISSION_BYTES):
            yield chunk
            chunk, num_bytes = [], SUBMISSION_OVERHEAD_BYTES
        chunk.append(group)
        num_bytes += size
    if chunk:
        yield chunk
