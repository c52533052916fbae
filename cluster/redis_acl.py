"""The local cluster's Redis users: one per trusted service with a random password per run, and the default
user disabled, written as an ACL file redis-server loads (`--aclfile`; passwords only as sha256 there).

    user          keys               commands
    default       * (off)            off: no connection can log in as it or run anything unauthenticated;
                                     its rules serve only the AOF replay (below)
    coordinator   rl:<run_id>:*      +@all -@dangerous (the work API: leases, answers, failures)
    reward        rl:<run_id>:*      +@all -@dangerous
    learner       rl:<run_id>:*      +@all -@dangerous
    operator      *                  +@all (the runner's readiness probe, tools and people; never given to a service)

Workers have no Redis user: they reach the run only through the coordinator's work API
(docs/threat_model.md). `-@dangerous` takes away FLUSHALL, FLUSHDB, KEYS, CONFIG, DEBUG, SHUTDOWN, MONITOR,
ACL, CLIENT KILL, INFO ... which no service's code issues.

The file is written 0600 and stays so: redis-server runs with umask 077 (cluster/redis_server.py), so an
ACL SAVE by an operator (a new file renamed over this one) does not make it world-readable.

Why the disabled default user still holds `~* &* +@all`: a restarted Redis replays its AOF through a fake
client that runs as the default user, and EXEC re-checks the ACL of every command of a transaction it
replays (seen with Debian's redis-server 7.0.15; redis/redis#14541, fixed by #14545; valkey-io/valkey#3983).
With `-@all` every MULTI/EXEC in the AOF (a scored group with its ack, the coordinator's worker records)
was refused at load and silently lost: after a kill -9 of Redis the streams were hundreds of entries short
(the fault suite's `test_kill_9_of_redis`). `off` alone keeps connections out; the permissions are only
used by the replay.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from shared.redis_urls import with_credentials

TRUSTED_SERVICES = ("coordinator", "reward", "learner")
OPERATOR = "operator"
REDIS_USERS = (*TRUSTED_SERVICES, OPERATOR)  # every user with a password
_SERVICE_RULES = ("resetchannels", "-@all", "+@all", "-@dangerous")


@dataclass(frozen=True)
class RedisUsers:
    """The trusted users of one run and their passwords (random per run: the runner hands each service
    its own URL with its own password)."""

    run_id: str
    passwords: dict[str, str] = field(default_factory=lambda: {name: secrets.token_urlsafe(24) for name in REDIS_USERS})

    def url_for(self, name: str, base_url: str) -> str:
        """`base_url` (no credentials) with `name`'s user and password."""
        return with_credentials(base_url, name, self.passwords[name])

    def rules(self, name: str) -> list[str]:
        if name == OPERATOR:
            return ["on", "~*", "&*", "+@all"]
        return ["on", f"~rl:{self.run_id}:*", *_SERVICE_RULES]

    def acl_file_text(self) -> str:
        lines = ["user default off ~* &* +@all"]  # off: nobody logs in; the rules let the AOF replay (module doc)
        for name, password in self.passwords.items():
            digest = hashlib.sha256(password.encode()).hexdigest()
            lines.append(" ".join(["user", name, *self.rules(name), f"#{digest}"]))
        return "\n".join(lines) + "\n"

    def write_acl_file(self, path: Path) -> bool:
        """The ACL file redis-server loads (mode 0600), replaced whole (a new file renamed over the old one,
        never truncated under a running Redis) and only when its text changes. Returns whether it changed:
        a second `docker compose up` with the same .env leaves a live Redis's file untouched."""
        text = self.acl_file_text()
        if path.exists() and path.read_text() == text:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        staging.replace(path)
        return True


def main(argv: list[str] | None = None) -> None:
    """`python -m cluster.redis_acl --run-id <id> --out <file>`: the ACL file for a deployment whose
    passwords come from the environment (RL_REDIS_PASSWORD_COORDINATOR, _REWARD, _LEARNER, _OPERATOR),
    as docker-compose.yml's `redis-acl` step does."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cluster.redis_acl", description=main.__doc__)
    parser.add_argument("--run-id", required=True, help="the run whose keys (rl:<run_id>:*) the services may touch")
    parser.add_argument("--out", type=Path, required=True, help="the ACL file to write (mode 0600)")
    args = parser.parse_args(argv)
    from cluster.tool_settings import tool_settings

    names = REDIS_USERS
    environment = tool_settings("python -m cluster.redis_acl")
    passwords = {name: environment.redis_password(name) for name in names}
    missing = [f"RL_REDIS_PASSWORD_{name.upper()}" for name, password in passwords.items() if not password]
    if missing:
        raise SystemExit(f"set {', '.join(missing)}")
    users = RedisUsers(args.run_id, passwords={name: password for name, password in passwords.items() if password})
    if users.write_acl_file(args.out):
        print(f"wrote {args.out}: users {', '.join(names)}; the default user is off")
    else:
        print(f"{args.out} is up to date: left as it is")


if __name__ == "__main__":
    main()
