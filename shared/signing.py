"""The keys that sign policy weights: an Ed25519 pair, the private half held by the learner alone.

The learner signs every manifest it publishes with the private key (RL_SIGNING_KEY); everyone else
(rollout workers, their chunk servers, the relay children they serve, tools) holds only the public
key (RL_WEIGHTS_PUBLIC_KEY), which verifies a signature but cannot make one. Why asymmetric: with the
shared HMAC key used before (RL_CLUSTER_KEY), every worker that could verify could also sign, so any
worker could serve forged weights to its relay children. Now a worker holds no secret that lets it
produce anything another component trusts as the learner's.

Key text, both halves: lowercase hex of the raw 32-byte key (64 characters): one token that fits an
env file, a compose secret or a shell variable without PEM's line breaks. A key id (the first 16 hex
of the public key's sha256) goes into every manifest, so a receiver configured with another public
key says "signed by key X, I trust key Y" instead of a bare "bad signature".

The manifest-level operations (`sign`, `verify_signature`) are in shared/weight_channel/manifest.py, next to Manifest.

    python -m shared.signing generate   # a new pair: RL_SIGNING_KEY=... and RL_WEIGHTS_PUBLIC_KEY=...
    python -m shared.signing public     # the public half of $RL_SIGNING_KEY
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

SIGNING_KEY_ENV = "RL_SIGNING_KEY"  # the learner's private key
PUBLIC_KEY_ENV = "RL_WEIGHTS_PUBLIC_KEY"  # every other component's public key
KEY_HEX_PATTERN = r"^[0-9a-f]{64}$"  # 32 raw bytes
KEY_ID_PATTERN = r"^[0-9a-f]{16}$"
_KEY_HEX = re.compile(KEY_HEX_PATTERN)

__all__ = [
    "KEY_HEX_PATTERN",
    "KEY_ID_PATTERN",
    "PUBLIC_KEY_ENV",
    "SIGNING_KEY_ENV",
    "Ed25519PrivateKey",
    "Ed25519PublicKey",
    "KeyPair",
    "generate_key_pair",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "public_key_hex",
]


@dataclass(frozen=True)
class KeyPair:
    """A fresh pair as key text: `signing_key_hex` for the learner only, `public_key_hex` for the rest."""

    signing_key_hex: str
    public_key_hex: str

    def env_lines(self) -> str:
        return f"{SIGNING_KEY_ENV}={self.signing_key_hex}\n{PUBLIC_KEY_ENV}={self.public_key_hex}\n"

    def __repr__(self) -> str:  # never print the private half by accident (logs, tracebacks)
        return f"KeyPair(public_key_hex={self.public_key_hex!r}, key_id={self.key_id!r})"

    @property
    def key_id(self) -> str:
        return key_id(load_public_key(self.public_key_hex))


def generate_key_pair() -> KeyPair:
    private = Ed25519PrivateKey.generate()
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return KeyPair(signing_key_hex=raw.hex(), public_key_hex=public_key_hex(private.public_key()))


def load_signing_key(text: str) -> Ed25519PrivateKey:
    """The learner's private key from its key text; ValueError (without the text) if malformed."""
    return Ed25519PrivateKey.from_private_bytes(_raw_key(text, SIGNING_KEY_ENV))


def load_public_key(text: str) -> Ed25519PublicKey:
    """The learner's public key from its key text; ValueError if malformed."""
    return Ed25519PublicKey.from_public_bytes(_raw_key(text, PUBLIC_KEY_ENV))


def public_key_hex(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short, stable name for a public key: the first 16 hex of the sha256 of its raw bytes."""
    return hashlib.sha256(public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()[:16]


def _raw_key(text: str, variable: str) -> bytes:
    text = text.strip().lower()
    if not _KEY_HEX.match(text):
        # the text itself stays out of the message: it may be a private key pasted in the wrong place
        raise ValueError(
            f"{variable} must be the hex of a raw 32-byte Ed25519 key (64 hex characters, "
            f"`python -m shared.signing generate`), got {len(text)} characters"
        )
    return bytes.fromhex(text)


class SigningKeyEnvironment(BaseSettings):
    """`python -m shared.signing public`'s one setting: the learner's RL_SIGNING_KEY, and nothing else of its own."""

    model_config = SettingsConfigDict(env_prefix="RL_", extra="ignore", env_ignore_empty=True)

    signing_key: SecretStr | None = None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.signing", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("generate", help=f"print a new key pair as {SIGNING_KEY_ENV}=... and {PUBLIC_KEY_ENV}=...")
    commands.add_parser("public", help=f"print {PUBLIC_KEY_ENV}=... for the private key in ${SIGNING_KEY_ENV}")
    args = parser.parse_args(argv)
    if args.command == "generate":
        sys.stdout.write(generate_key_pair().env_lines())
        return 0
    secret = SigningKeyEnvironment().signing_key
    if secret is None:
        sys.exit(f"{SIGNING_KEY_ENV} is not set")
    text = secret.get_secret_value()
    try:
        public = load_signing_key(text).public_key()
    except ValueError as exc:
        sys.exit(str(exc))
    sys.stdout.write(f"{PUBLIC_KEY_ENV}={public_key_hex(public)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
