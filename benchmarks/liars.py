"""Lying rollout workers, FOR TESTS AND MEASUREMENT ONLY (docs/trust.md): wrappers around an honest
worker's engine and chunk store, started as `python -m benchmarks.liar_worker` (its `liar_entry_points`, given
to the local runner) by the fault suite (`make test-faults`) and `make bench-trust`.

    garbage_logprobs   behaviour log-probs replaced by random numbers             LyingEngine
    stale_weights      stops loading weights after `stale_after_version` but      LyingEngine
                       reports the newest version it was given as its own, so the
                       worker claims (and gates on) that version for every group
    swapped_text       completion token ids replaced by other (valid) ids of the   LyingEngine
                       prompt's samples, the text and log-probs kept: reward on one
                       thing, training on another
    corrupt_chunks     its chunk server serves every chunk it relays with a bit    TamperingStore
                       flipped
    forged_manifest    its chunk server serves, for every version it holds, a      TamperingStore
                       manifest signed by a key of its own for weights of its own
                       (the real ones, each chunk tampered with), and those chunks
                       to whoever asks for the version

The worker (services/rollout/worker.py) knows nothing of them: it samples with the engine and relays from
the store it is given, and signs what it builds (the MAC binds a group to its producer, not to the truth).
The learner's trust score must catch the first three; relay children must refuse what the last two serve
(they verify every chunk against the learner's signed manifest, which they fetch from the learner only).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

import numpy as np

from engines.continuous import ContinuousBatch, FinishedSample, SampleRequest, StepStats, VersionChange
from engines.interface import InferenceEngine, Sample, Sampling
from shared.signing import Ed25519PrivateKey, Ed25519PublicKey
from shared.tokenization import PromptInput
from shared.weight_channel import Buffer, ChunkStore, LoraAdapter, Manifest
from shared.weight_channel.manifest import Payload, chunk_digests, payload_digest, sign
from shared.weight_channel.store import ReceivedBytes

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER_VERSION = 2


class FaultKind(StrEnum):
    GARBAGE_LOGPROBS = "garbage_logprobs"
    STALE_WEIGHTS = "stale_weights"
    SWAPPED_TEXT = "swapped_text"
    CORRUPT_CHUNKS = "corrupt_chunks"
    FORGED_MANIFEST = "forged_manifest"


SERVING_FAULTS = (FaultKind.CORRUPT_CHUNKS, FaultKind.FORGED_MANIFEST)  # lies of the chunk server, not the groups


class LyingEngine(InferenceEngine):
    """An engine that lies (garbage_logprobs, swapped_text, stale_weights) about what `inner` does."""

    def __init__(
        self,
        inner: InferenceEngine,
        kind: FaultKind,
        stale_after_version: int = DEFAULT_STALE_AFTER_VERSION,
        seed: int = 0,
    ) -> None:
        if kind in SERVING_FAULTS:
            raise ValueError(f"{kind} is a lie of the chunk store (TamperingStore), not of the engine")
        self.inner = inner
        self.kind = kind
        self.stale_after_version = stale_after_version
        self.model_fingerprint = inner.model_fingerprint
        self.max_positions = inner.max_positions
        self.weights_dir = inner.weights_dir
        self.model_dir = inner.model_dir
        self._np_rng = np.random.default_rng(seed)
        self._newest_given = -1  # the newest version the worker asked it to load

    @property
    def policy_version(self) -> int:
        """stale_weights: the newest version it was given, loaded or not; else the inner engine's."""
        return max(self.inner.policy_version, self._newest_given)

    def loads_weights(self) -> bool:
        """stale_weights: no more swaps once `stale_after_version` is loaded."""
        return self.kind != FaultKind.STALE_WEIGHTS or self.inner.policy_version < self.stale_after_version

    def load_weights(self, safetensors_bytes: Buffer, policy_version: int, path: Path | None = None) -> None:
        if self.loads_weights():
            self.inner.load_weights(safetensors_bytes, policy_version, path)
        else:
            self._newest_given = max(self._newest_given, policy_version)

    def load_adapter(self, adapter_bytes: Buffer, adapter: LoraAdapter, policy_version: int) -> None:
        if self.loads_weights():
            self.inner.load_adapter(adapter_bytes, adapter, policy_version)
        else:
            self._newest_given = max(self._newest_given, policy_version)

    def generate(
        self,
        prompts: Sequence[str | PromptInput],
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        return [self.lie_about(group) for group in self.inner.generate(prompts, sampling, sampling_seeds)]

    def generate_from_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        sampling_seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        return [self.lie_about(group) for group in self.inner.generate_from_ids(prompt_ids, sampling, sampling_seeds)]

    def encode_prompts(self, prompts: Sequence[str | PromptInput], max_new_tokens: int = 0) -> list[list[int]]:
        return self.inner.encode_prompts(prompts, max_new_tokens)

    def encode_observation(self, text: str) -> list[int]:
        return self.inner.encode_observation(text)

    def continuous_batch(self, max_rows: int) -> ContinuousBatch:
        return LyingContinuousBatch(self, self.inner.continuous_batch(max_rows))

    def lie_about(self, samples: list[Sample]) -> list[Sample]:
        """The samples of one prompt (one group) as the liar reports them."""
        if self.kind == FaultKind.GARBAGE_LOGPROBS:
            return [
                dataclasses.replace(sample, logprobs=self._np_rng.uniform(-8.0, -0.01, sample.num_tokens).tolist())
                for sample in samples
            ]
        if self.kind == FaultKind.SWAPPED_TEXT and samples:
            # ids the vocabulary surely has: the prompt's and every sample's of the group
            pool = np.array(samples[0].prompt_token_ids + [token for s in samples for token in s.token_ids])
            return [
                dataclasses.replace(sample, token_ids=self._np_rng.choice(pool, sample.num_tokens).tolist())
                for sample in samples
            ]
        return samples


class LyingContinuousBatch(ContinuousBatch):
    """The inner engine's continuous batch, its finished samples reported as the liar reports them: each
    sample's lie as in batch mode (swapped_text draws from its prompt and its own tokens), and stale_weights
    claims that the whole sample came from the newest version it was given."""

    def __init__(self, engine: LyingEngine, inner: ContinuousBatch) -> None:
        self.engine = engine
        self.inner = inner
        self.max_rows = inner.max_rows

    def add(self, requests: Sequence[SampleRequest]) -> None:
        self.inner.add(requests)

    def step(self) -> list[FinishedSample]:
        finished = self.inner.step()
        if self.engine.kind == FaultKind.STALE_WEIGHTS:
            claimed = (VersionChange(0, self.engine.policy_version),)
            return [dataclasses.replace(done, versions=claimed) for done in finished]
        return [dataclasses.replace(done, sample=self.engine.lie_about([done.sample])[0]) for done in finished]

    def abort(self, request_ids: Sequence[int]) -> None:
        self.inner.abort(request_ids)

    @property
    def num_running(self) -> int:
        return self.inner.num_running

    @property
    def num_waiting(self) -> int:
        return self.inner.num_waiting

    @property
    def last_step(self) -> StepStats | None:
        return self.inner.last_step


def tamper(chunk: Buffer) -> bytes:
    """The chunk with its first bit flipped (bad memory, a bad disk, a malicious relay)."""
    data = bytes(chunk)
    return bytes([data[0] ^ 1]) + data[1:] if data else data


class TamperingStore(ChunkStore):
    """A worker's chunk store whose reads for serving lie (corrupt_chunks, forged_manifest); what the worker
    itself fetches, verifies and loads goes through the honest ChunkStore methods it inherits
    (receive_region, commit_chunk, payload), so the liar samples with the real weights and only its relay
    children see the lies."""

    def __init__(
        self, kind: FaultKind, keep_versions: int, trusted_key: Ed25519PublicKey | None, spill_dir: Path | None
    ) -> None:
        if kind not in SERVING_FAULTS:
            raise ValueError(f"{kind} is a lie of the engine (LyingEngine), not of the chunk store")
        super().__init__(keep_versions=keep_versions, trusted_key=trusted_key, spill_dir=spill_dir)
        self.kind = kind
        self.forging_key = Ed25519PrivateKey.generate()  # not the learner's: what it signs, nobody trusts

    def get_chunk(
        self,
        policy_version: int,
        index: int,
        wait_s: float = 0.0,
        payload: Payload = "full",
        manifest_sha256: str | None = None,
    ) -> memoryview | None:
        chunk = super().get_chunk(policy_version, index, wait_s, payload, manifest_sha256)
        return memoryview(tamper(chunk)) if chunk is not None else None

    def wait_received(
        self, manifest: Manifest, index: int, offset: int, stall_s: float, requester_url: str = ""
    ) -> ReceivedBytes | None:
        """Chunks forwarded cut-through, before they are held, are served flipped too (their verdict stays
        "verified": the lie is caught by the child's own check, and charged to this worker)."""
        received = super().wait_received(manifest, index, offset, stall_s, requester_url)
        if received is None or offset != 0 or not received.data:
            return received
        return ReceivedBytes(memoryview(tamper(received.data)), received.attempt, received.held)

    def manifest(self, policy_version: int, payload: Payload = "full") -> Manifest | None:
        real = super().manifest(policy_version, payload)
        if real is None or self.kind != FaultKind.FORGED_MANIFEST or not self.is_complete(policy_version, payload):
            return real
        return self.forge(real)

    def forge(self, real: Manifest) -> Manifest:
        """`real` describing the tampered chunks instead, signed by this worker's own key."""
        digests = chunk_digests(real.hash_algorithm, [tamper(chunk) for chunk in self.chunks(real)])
        digest = payload_digest(real.hash_algorithm, real.total_size_bytes, real.chunk_size_bytes, digests)
        forged = real.model_copy(
            update={
                "chunk_digests": digests,
                "digest": digest,
                "full_digest": digest if real.payload == "full" else real.full_digest,
            }
        )
        return sign(forged, self.forging_key)
