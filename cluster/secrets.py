"""Fresh secrets for a deployment, in one place: the workers' join credential, the admin token, a new Ed25519
pair for weight manifests, one Redis password per trusted user (cluster/redis_acl.py), and the coordinator's TLS:
a run CA and a server certificate (cluster/tls.py). Two renderings:

    relay-rl keys --compose --out .env     the .env file docker-compose.yml reads: every variable it
                                           requires (`make keys` writes it, mode 0600; on an existing
                                           file it adds the missing ones and never changes a value), and
                                           the TLS files in tls/ beside it (RL_TLS_DIR; kept when there)
    deploy/make_secrets.py --out x.yaml    the Helm chart's values file (docs/kubernetes.md), TLS included

The workers' join credential is an operator credential (`op-<12 hex>.<secret>`, services/coordinator/operators.py),
not a shared join token: the coordinator provisions it at start (RL_OPERATOR_TOKENS) and the workers send it, so
they have a budget and a record of their own, and quarantine sticks to it. Another operator gets another one
(`relay-rl operators issue NAME`).

Every value is hex (the credential: hex around its "op-" and "."): URL-safe (each Redis password goes into its
service's redis://user:password@host URL as it is), never beginning with "-" (which a command line would take
for a flag), no quoting needed.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from cluster.redis_acl import REDIS_USERS
from cluster.tls import TlsFiles
from shared.signing import generate_key_pair

TLS_DIR_VARIABLE = "RL_TLS_DIR"  # docker-compose.yml: the folder of ca.pem, server.pem and server.key


def _token() -> str:
    return secrets.token_hex(24)


def _operator_token() -> str:
    """A join credential's token as the coordinator's `issue` makes them (op-<12 hex>.<secret>), hex throughout."""
    return f"op-{secrets.token_hex(6)}.{secrets.token_hex(24)}"


@dataclass(frozen=True)
class ClusterSecrets:
    operator_token: str = field(default_factory=_operator_token)  # the workers' join credential (RL_OPERATOR_TOKENS)
    admin_token: str = field(default_factory=_token)  # the coordinator's admin endpoints; never a worker's
    redis_passwords: dict[str, str] = field(default_factory=lambda: {user: _token() for user in REDIS_USERS})
    weights_public_key: str = ""
    signing_key: str = ""  # the private half: the learner's alone

    @classmethod
    def generate(cls) -> ClusterSecrets:
        pair = generate_key_pair()
        return cls(weights_public_key=pair.public_key_hex, signing_key=pair.signing_key_hex)

    def compose_env(self, tls_dir: Path) -> dict[str, str]:
        """Every variable docker-compose.yml requires (`${NAME:?...}`); `tls_dir`: where its TLS files are."""
        return {
            "RL_OPERATOR_TOKEN": self.operator_token,
            "RL_ADMIN_TOKEN": self.admin_token,
            "RL_WEIGHTS_PUBLIC_KEY": self.weights_public_key,
            "RL_SIGNING_KEY": self.signing_key,
            **{f"RL_REDIS_PASSWORD_{user.upper()}": password for user, password in self.redis_passwords.items()},
            TLS_DIR_VARIABLE: str(tls_dir.resolve()),
        }

    def compose_env_text(self, tls_dir: Path) -> str:
        lines = [
            "# relay-rl secrets for docker compose (relay-rl keys --compose): keep private, never commit",
            *(f"{name}={value}" for name, value in self.compose_env(tls_dir).items()),
            "# Workers on other machines: set the address they reach this machine at (docs/docker.md), and have the",
            f"# coordinator's certificate in {TLS_DIR_VARIABLE} name it (relay-rl keys --compose --tls-host ADDRESS);",
            f"# this machine's outbound address is {outbound_address()}",
            "# RL_PUBLIC_HOST=",
        ]
        return "\n".join(lines) + "\n"

    def helm_values(self, tls: TlsFiles) -> dict[str, object]:
        """The chart's `secrets` values; `tls`: the coordinator's certificate, its key and the run CA, inlined."""
        return {
            "secrets": {
                "create": True,
                "operatorToken": self.operator_token,
                "adminToken": self.admin_token,
                "weightsPublicKey": self.weights_public_key,
                "signingKey": self.signing_key,
                "redisPasswords": dict(self.redis_passwords),
                "tls": {
                    "caCert": tls.ca_file.read_text(),
                    "serverCert": tls.cert_file.read_text(),
                    "serverKey": tls.key_file.read_text(),
                },
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


KEY_PAIR = ("RL_WEIGHTS_PUBLIC_KEY", "RL_SIGNING_KEY")  # one is useless without its own other half


def add_missing_compose_env(path: Path, fresh: ClusterSecrets, tls_dir: Path) -> list[str]:
    """`make keys` on an existing .env: append each variable docker-compose.yml requires that the file lacks, with
    its value from `fresh` (and `tls_dir`); a value already there is never changed (it may be a running cluster's
    secret). Returns the names added. ValueError when the file holds one half of the weight-signing pair: a fresh
    other half would not match it."""
    present = env_file_names(path.read_text())
    missing = {name: value for name, value in fresh.compose_env(tls_dir).items() if name not in present}
    lacking = [name for name in KEY_PAIR if name in missing]
    if len(lacking) == 1:
        (there,) = set(KEY_PAIR) - set(lacking)
        raise ValueError(f"{path} has {there} but not {lacking[0]}: they are a pair; remove {there} to make a new pair")
    if missing:
        text = path.read_text()
        lines = ["# added by relay-rl keys --compose", *(f"{name}={value}" for name, value in missing.items())]
        with path.open("a") as f:
            f.write(("" if not text or text.endswith("\n") else "\n") + "\n".join(lines) + "\n")
    return list(missing)


def env_file_names(text: str) -> set[str]:
    """The variables a .env file sets (KEY=VALUE lines; comments and blank lines skipped)."""
    return set(env_file_values(text))


def env_file_values(text: str) -> dict[str, str]:
    """The KEY=VALUE lines of a .env file (comments and blank lines skipped)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            values[name.removeprefix("export ").strip()] = value.strip()
    return values


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
