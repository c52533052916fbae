"""Rollouts bound to their producer: a RolloutGroup carries an HMAC-SHA256 (`producer_mac`) of its own bytes
under a key only its worker and the trusted services know.

The coordinator issues each worker a random 32-byte key at registration (answer field
`access.rollout_key_hex`, stored under `RunKeys.rollout_key(worker_id)`, which a worker's Redis user cannot
read); the worker signs every group it publishes; the reward service looks the key up by the group's
`worker_id` and dead-letters a group whose mac does not match (services/reward/provenance.py). A worker
can therefore not post under another worker's id, nor alter another worker's group, without the reward
service noticing. The mac covers every field but itself: the msgpack encoding of the group with
`producer_mac` empty, which is deterministic for a given schema version.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from shared.messages import RolloutGroup

ROLLOUT_KEY_BYTES = 32


def new_rollout_key() -> bytes:
    return secrets.token_bytes(ROLLOUT_KEY_BYTES)


def rollout_mac(group: RolloutGroup, key: bytes) -> bytes:
    """HMAC-SHA256 over the group's encoding with `producer_mac` empty (32 bytes)."""
    unsigned = group.model_copy(update={"producer_mac": b""})
    return hmac.new(key, unsigned.encode(), hashlib.sha256).digest()


def sign_rollout(group: RolloutGroup, key: bytes) -> RolloutGroup:
    return group.model_copy(update={"producer_mac": rollout_mac(group, key)})


def mac_matches(group: RolloutGroup, key: bytes) -> bool:
    """Constant-time check of the group's `producer_mac` against `key`."""
    return hmac.compare_digest(group.producer_mac, rollout_mac(group, key))
