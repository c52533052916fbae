"""Fault injection: a rollout worker that lies, FOR TESTS AND MEASUREMENT ONLY (docs/trust.md).

    RL_FAULT_INJECT=garbage_logprobs   behaviour log-probs replaced by random numbers
    RL_FAULT_INJECT=stale_weights      stops loading weights after RL_FAULT_STALE_AFTER_VERSION (default 2)
                                       but claims the newest announced version for every group
    RL_FAULT_INJECT=swapped_text       completion token ids replaced by other (valid) ids of the group,
                                       the text and log-probs kept: reward on one thing, training on another
    RL_FAULT_INJECT=corrupt_chunks     its chunk server serves every chunk it relays with a bit flipped
    RL_FAULT_INJECT=forged_manifest    its chunk server serves, for every version it holds, a manifest signed
                                       by a key of its own for weights of its own (the real ones, each chunk
                                       tampered with), and those chunks to whoever asks for the version

Refused unless RL_ALLOW_FAULT_INJECTION=1 is set as well, so a stray variable in a real deployment cannot
turn a worker into a liar. The fault suite (`make test-faults`, tests/faults/) and `make bench-trust` start
such workers (cluster/local.py: ClusterOptions.liars) to check that the learner's trust score catches the
first three and that relay children refuse what the last two serve (they verify every chunk against the
learner's signed manifest, which they fetch from the learner only).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

import numpy as np

from shared.messages import RolloutGroup, pack_float32, pack_int32, unpack_float32, unpack_int32
from shared.signing import Ed25519PrivateKey, Ed25519PublicKey
from shared.weight_channel import Buffer, ChunkStore, Manifest
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


class FaultInjector:
    """What a lying worker does differently; the worker asks it at three points (see worker.py)."""

    def __init__(self, kind: FaultKind, stale_after_version: int = DEFAULT_STALE_AFTER_VERSION, seed: int = 0) -> None:
        self.kind = kind
        self.stale_after_version = stale_after_version
        self._rng = random.Random(seed)
        self._np_rng = np.random.default_rng(seed)

    def loads_weights(self, loaded_version: int) -> bool:
        """stale_weights: no more swaps once `stale_after_version` is loaded."""
        return self.kind != FaultKind.STALE_WEIGHTS or loaded_version < self.stale_after_version

    def claimed_version(self, loaded_version: int, newest_announced: int | None) -> int:
        """The version the worker writes on its groups (and gates on): stale_weights claims the newest."""
        if self.kind == FaultKind.STALE_WEIGHTS and newest_announced is not None and loaded_version >= 0:
            return max(loaded_version, newest_announced)
        return loaded_version

    def apply(self, group: RolloutGroup) -> RolloutGroup:
        """The group as the liar posts it."""
        if self.kind == FaultKind.GARBAGE_LOGPROBS:
            num_tokens = len(unpack_float32(group.behaviour_logprobs))
            garbage = self._np_rng.uniform(-8.0, -0.01, size=num_tokens)
            return group.model_copy(update={"behaviour_logprobs": pack_float32(garbage)})
        if self.kind == FaultKind.SWAPPED_TEXT:
            completion = unpack_int32(group.completion_token_ids)
            pool = np.concatenate([group.prompt_tokens(), completion])  # ids the vocabulary surely has
            swapped = self._np_rng.choice(pool, size=len(completion))
            return group.model_copy(update={"completion_token_ids": pack_int32(swapped)})
        return group


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

    def wait_received(self, manifest: Manifest, index: int, offset: int, stall_s: float) -> ReceivedBytes | None:
        """Chunks forwarded cut-through, before they are held, are served flipped too (their verdict stays
        "verified": the lie is caught by the child's own check, and charged to this worker)."""
        received = super().wait_received(manifest, index, offset, stall_s)
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


def serving_store(
    fault: FaultInjector | None,
    keep_versions: int,
    trusted_key: Ed25519PublicKey | None,
    spill_dir: Path | None = None,
) -> ChunkStore:
    """The worker's chunk store: a TamperingStore for a chunk-serving fault, else the honest one."""
    if fault is not None and fault.kind in SERVING_FAULTS:
        return TamperingStore(fault.kind, keep_versions, trusted_key, spill_dir)
    return ChunkStore(keep_versions=keep_versions, trusted_key=trusted_key, spill_dir=spill_dir)


def fault_from_environment(environ: Mapping[str, str] = os.environ) -> FaultInjector | None:
    """The injector RL_FAULT_INJECT names, or None. Raises ValueError for an unknown kind, or when
    RL_ALLOW_FAULT_INJECTION=1 is missing (test-only switch)."""
    name = environ.get("RL_FAULT_INJECT", "")
    if not name:
        return None
    if environ.get("RL_ALLOW_FAULT_INJECTION") != "1":
        raise ValueError("RL_FAULT_INJECT is for tests and measurement only: set RL_ALLOW_FAULT_INJECTION=1 too")
    try:
        kind = FaultKind(name)
    except ValueError:
        raise ValueError(f"RL_FAULT_INJECT={name!r}: expected one of {[k.value for k in FaultKind]}") from None
    stale_after = int(environ.get("RL_FAULT_STALE_AFTER_VERSION", DEFAULT_STALE_AFTER_VERSION))
    log.warning("FAULT INJECTION ON (%s): this worker lies on purpose (tests and measurement only)", kind.value)
    return FaultInjector(kind, stale_after_version=stale_after)
