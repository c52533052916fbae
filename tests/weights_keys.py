"""The tests' weight-signing keys: the learner's Ed25519 pair (new per test session), and a forger's.

The learner signs with SIGNING_KEY; workers, chunk stores and fetchers are given PUBLIC_KEY (or
PUBLIC_KEY_HEX, as RL_WEIGHTS_PUBLIC_KEY) only. FORGER_KEY is any other Ed25519 key: what a malicious
worker could sign with, since it never holds the learner's."""

from __future__ import annotations

from shared.signing import Ed25519PrivateKey, generate_key_pair, load_public_key, load_signing_key

KEYS = generate_key_pair()
SIGNING_KEY_HEX = KEYS.signing_key_hex  # RL_SIGNING_KEY of a learner under test
PUBLIC_KEY_HEX = KEYS.public_key_hex  # RL_WEIGHTS_PUBLIC_KEY of everything else
SIGNING_KEY = load_signing_key(SIGNING_KEY_HEX)
PUBLIC_KEY = load_public_key(PUBLIC_KEY_HEX)
FORGER_KEY = Ed25519PrivateKey.generate()
