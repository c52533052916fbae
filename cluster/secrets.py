"""Fresh secrets for a deployment, in one place: the join and admin tokens, a new Ed25519 pair for weight
manifests, and one Redis password per trusted user (cluster/redis_acl.py). Two renderings:

    relay-rl keys --compose --out .env     the .env file docker-compose.yml reads: every variable it
                                           requires (`make keys` writes it; mode 0600, never overwritten)
    deploy/make_secrets.py --out x.yaml    the Helm chart's values file (docs/kubernetes.md)

Every value is hex: URL-safe (each Redis password goes into its service's redis://user:password@host URL
as it is), never beginning with "-" (which a command line would take for a flag), no quoting needed.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from cluster.redis_acl import REDIS_USERS
from shared.signing import generate_key_pair


def _token() -> str:
    return secrets.token_hex(24)


@dataclass(frozen=True)
class ClusterSecrets:
    join_token: str = field(default_factory=_token)  # what a worker sends to register
    admin_token: str = field(default_factory=_token)  # the coordinator's admin endpoints; never a worker's
    redis_passwords: dict[str, str] = field(default_factory=lambda: {user: _token() for user in REDIS_USERS})
    weights_public_key: str = ""
    signing_key: str = ""  # the private half: the learner's alone

    @classmethod
    def generate(cls) -> ClusterSecrets:
        pair = generate_key_pair()
        return cls(weights_public_key=pair.public_key_hex, signing_key=pair.signing_key_hex)

    def compose_env(self) -> dict[str, str]:
        """Every variable docker-compose.yml requires (`${NAME:?...}`)."""
        return {
            "RL_JOIN_TOKEN": self.join_token,
            "RL_ADMIN_TOKEN": self.admin_token,
            "RL_WEIGHTS_PUBLIC_KEY": self.weights_public_key,
            "RL_SIGNING_KEY": self.signing_key,
            **{f"RL_REDIS_PASSWORD_{user.upper()}": password for user, password in self.redis_passwords.items()},
        }

    def compose_env_text(self) -> str:
        lines = [
            "# relay-rl secrets for docker compose (relay-rl keys --compose): keep private, never commit",
            *(f"{name}={value}" for name, value in self.compose_env().items()),
            "# Workers on other machines: set the address they reach this machine at (docs/docker.md);",
            f"# this machine's outbound address is {outbound_address()}",
            "# RL_PUBLIC_HOST=",
        ]
        return "\n".join(lines) + "\n"

    def helm_values(self) -> dict[str, object]:
        return {
            "secrets": {
                "create": True,
                "joinToken": self.join_token,
                "adminToken": self.admin_token,
                "weightsPublicKey": self.weights_public_key,
                "signingKey": self.signing_key,
                "redisPasswords": dict(self.redis_passwords),
            }
        }


def outbound_address() -> str:
    """The address this machine sends from on its default route (no packet is sent), else its hostname."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: a route lookup only
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def write_private(path: Path, text: str, *, overwrite: bool = False) -> None:
    """`text` into a new file readable by its owner alone (0600). An existing file is an error unless
    `overwrite`: a second `make keys` must not replace the secrets a running cluster uses."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise FileExistsError(f"{path} exists: its secrets may be a running cluster's (remove it first)") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
