"""VLLMContinuousBatch: continuous batching on vLLM's own engine loop (engines/continuous.py).

vLLM's scheduler already batches continuously; this drives it a step at a time instead of one offline
`generate` per batch: rows enter through `LLMEngine.add_request` (each sample its own request, carrying its
keyed seed, engines/vllm_keyed_sampler.py), `LLMEngine.step` runs one scheduler step (admission, chunked
prefill, one decoded token per running request) and returns each request's new tokens (RequestOutputKind.
DELTA). At most `max_rows` requests are in vLLM at once; the rest wait here.

Weights: `VLLMEngine.load_weights` between two steps, with requests running, reloads in place and then
resets the prefix cache with `reset_running_requests=True`: vLLM preempts every running request back to its
waiting queue, and the next step recomputes each one's KV (prompt and output tokens so far) under the new
weights before decoding on. Keyed sampling positions count the output tokens, so a recomputed request goes on
at the position it had. Tokens that come out of steps after the load are the new version's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engines.continuous import (
    ContinuousBatch,
    FinishedSample,
    Row,
    SampleRequest,
    StepStats,
    VersionChange,
    record_change,
)

if TYPE_CHECKING:
    from engines.vllm_engine import VLLMEngine


class VLLMContinuousBatch(ContinuousBatch):
    def __init__(self, engine: VLLMEngine, max_rows: int) -> None:
        super().__init__(max_rows, engine.max_positions, engine.policy_version)
        self.engine = engine
        self.rows: dict[str, Row] = {}  # in vLLM, by vLLM request id

    @property
    def num_running(self) -> int:
        return len(self.rows)

    def abort(self, request_ids: Sequence[int]) -> None:
        dropped = set(request_ids)
        self.drop_waiting(dropped)
        gone = [key for key, row in self.rows.items() if row.request.request_id in dropped]
        if gone:
            self.engine.call_on_engine_thread(self.engine.llm.llm_engine.abort_request, gone)
        for key in gone:
            del self.rows[key]

    def step(self) -> list[FinishedSample]:
        recomputing = self._follow_weights()
        num_admitted = self._admit()
        num_rows = len(self.rows)
        started_s = time.perf_counter()
        outputs = self.engine.call_on_engine_thread(self.engine.llm.llm_engine.step) if self.rows else []
        step_s = time.perf_counter() - started_s
        finished = [done for output in outputs if (done := self._take(output)) is not None]
        # vLLM recomputes the preempted rows inside the step after a load: the whole step is its cost
        self._last_step = StepStats(num_rows, num_admitted, len(finished), step_s if recomputing else 0.0)
        return finished

    # the step's parts
    def _follow_weights(self) -> bool:
        """New weights since the last step (the engine already sent the running requests back to be
        recomputed): the running rows' later tokens are the new version's. True: rows were in flight, so
        the coming step recomputes them (a load with none in flight costs no recompute: the rows admitted
        after it start on the new weights)."""
        version = self.engine.policy_version
        if version == self.policy_version:
            return False
        self.policy_version = version
        for row in self.rows.values():
            record_change(row.versions, len(row.token_ids), version)
        return bool(self.rows)

    def _admit(self) -> int:
        admitted = self.take_waiting()
        if admitted:
            self.engine.call_on_engine_thread(self._add_to_vllm, admitted)
        return len(admitted)

    def _add_to_vllm(self, requests: list[SampleRequest]) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        llm_engine = self.engine.llm.llm_engine
        for request in requests:
            params = self.engine.sampling_params(request.sampling, keyed_seed=request.seed)
            params.output_kind = RequestOutputKind.DELTA  # each step: the tokens it added
            key = f"row-{request.request_id}-{time.monotonic_ns()}"
            llm_engine.add_request(
                key,
                TokensPrompt(prompt_token_ids=list(request.prompt_ids)),
                params,
                lora_request=self.engine.lora_request,
            )
            self.rows[key] = Row(request, versions=[VersionChange(0, self.policy_version)])

    def _take(self, output: Any) -> FinishedSample | None:
        """One request's new tokens; its FinishedSample once vLLM says it finished."""
        row = self.rows.get(output.request_id)
        if row is None:  # aborted meanwhile
            return None
        (completion,) = output.outputs
        new_ids = list(completion.token_ids)
        if new_ids:
            if completion.logprobs is None or len(completion.logprobs) != len(new_ids):
                raise RuntimeError(f"vLLM returned no log-prob for some of {len(new_ids)} tokens")
            row.token_ids.extend(new_ids)
            row.logprobs.extend(
                float(step[token].logprob) for step, token in zip(completion.logprobs, new_ids, strict=True)
            )
        if not output.finished:
            return None
        del self.rows[output.request_id]
        sample = self.engine.sample_of(list(row.request.prompt_ids), row.token_ids, row.logprobs, completion)
        return FinishedSample(row.request.request_id, sample, tuple(row.versions))
