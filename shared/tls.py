"""How a client of the coordinator makes sure whom it talks to before it sends a credential (issue 36).

Every HTTP client that carries a token to the coordinator (a worker's registration, heartbeats, work API and
weights long poll: services/rollout/; `relay-rl worker`, `make worker`, `relay-rl operators`, drain, status:
cluster/) takes its httpx `verify=` from one `CoordinatorTrust`:

    RL_COORDINATOR_CA_FILE       the run's CA certificate (PEM; `relay-rl keys`, cluster/tls.py): the server's
                                 chain and host name are checked against it alone, never the system's store
    RL_COORDINATOR_CERT_SHA256   a pin: the SHA-256 of the server certificate (64 hex, colons allowed). The chain
                                 is not checked; the certificate the server shows must be this one. It is checked
                                 inside the TLS handshake, so a mismatch fails the connection before a byte of the
                                 request (and its token) is written
    neither                      the system's trust store (httpx's default): a coordinator behind a certificate a
                                 public CA issued
    RL_INSECURE_HTTP=1           allow a plain http:// coordinator on a host that is not loopback (tokens cross the
                                 network in clear text: a test bed only; `--insecure` on the command line)

A plain http:// URL is refused unless its host is loopback (127.0.0.0/8, ::1, localhost): `check_url` raises
InsecureCoordinatorError with the one line to print. A failed verification surfaces from httpx as a ConnectError
caused by an ssl.SSLCertVerificationError (`is_verification_failure`): nothing was sent.

Standard library only: the command line's `--help` and the coordinator (which has no torch) import it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CA_FILE_ENV = "RL_COORDINATOR_CA_FILE"
CERT_SHA256_ENV = "RL_COORDINATOR_CERT_SHA256"
INSECURE_HTTP_ENV = "RL_INSECURE_HTTP"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})  # what pydantic-settings reads as True, for the tools' flags
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

Verify = ssl.SSLContext | bool  # what httpx's `verify=` takes


class InsecureCoordinatorError(ValueError):
    """A coordinator URL that would send credentials in clear text over a network; the message is one line."""


class CertificatePinError(ssl.SSLCertVerificationError):
    """The server's certificate is not the pinned one (raised inside the handshake: nothing was sent)."""

    def __str__(self) -> str:  # ssl.SSLError prints its args tuple when it has no strerror
        return str(self.args[0]) if self.args else ""


def normalize_sha256(text: str) -> str:
    """A certificate fingerprint as 64 lower-case hex digits; `AB:CD:...` (openssl's form) is accepted."""
    digest = text.strip().lower().replace(":", "")
    if not _SHA256_HEX.fullmatch(digest):
        raise ValueError(f"{CERT_SHA256_ENV}: not a SHA-256 (64 hex digits, colons allowed): {text[:80]!r}")
    return digest


def certificate_sha256(der: bytes) -> str:
    """The fingerprint of a certificate in DER form (what `openssl x509 -fingerprint -sha256` prints)."""
    return hashlib.sha256(der).hexdigest()


def pem_certificate_sha256(path: Path) -> str:
    """The fingerprint of the first certificate of a PEM file (a server's certificate, its chain after it)."""
    text = path.read_text()
    end = "-----END CERTIFICATE-----"
    if end not in text:
        raise ValueError(f"{path}: no PEM certificate in it")
    return certificate_sha256(ssl.PEM_cert_to_DER_cert(text[: text.index(end) + len(end)]))


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`: a connection that never leaves this machine."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def is_verification_failure(exc: BaseException) -> bool:
    """Whether an httpx error (or anything) was caused by a certificate that failed verification or its pin."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class CoordinatorTrust:
    """What a client trusts as the coordinator (module doc); build its httpx `verify=` with `verify_for(url)`."""

    ca_file: Path | None = None
    cert_sha256: str | None = None  # normalized to 64 lower-case hex digits
    insecure_http: bool = False

    def __post_init__(self) -> None:
        if self.cert_sha256 is not None:
            object.__setattr__(self, "cert_sha256", normalize_sha256(self.cert_sha256))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CoordinatorTrust:
        """From RL_COORDINATOR_CA_FILE, RL_COORDINATOR_CERT_SHA256 and RL_INSECURE_HTTP in `environ` (default the
        process's environment; a local cluster's cluster.env read as a dict works the same)."""
        environ = os.environ if environ is None else environ
        ca_file = environ.get(CA_FILE_ENV, "").strip()
        cert_sha256 = environ.get(CERT_SHA256_ENV, "").strip()
        return cls(
            ca_file=Path(ca_file) if ca_file else None,
            cert_sha256=cert_sha256 or None,
            insecure_http=environ.get(INSECURE_HTTP_ENV, "").strip().lower() in TRUE_WORDS,
        )

    def check_url(self, url: str) -> None:
        """InsecureCoordinatorError for a plain http:// URL whose host is not loopback (unless insecure_http)."""
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme == "https":
            return
        if scheme != "http":
            raise InsecureCoordinatorError(f"coordinator URL {url!r}: neither https:// nor http://")
        host = parts.hostname or ""
        if self.insecure_http or is_loopback_host(host):
            return
        raise InsecureCoordinatorError(
            f"refusing plain http:// to the coordinator at {host}: its tokens would cross the network in clear "
            f"text. Use its https:// URL (with {CA_FILE_ENV} or {CERT_SHA256_ENV}: docs/operations.md), or "
            f"pass --insecure / {INSECURE_HTTP_ENV}=1 on a test bed"
        )

    def verify(self) -> Verify:
        """httpx's `verify=`: a pinned context, the run CA's, or True (the system's store)."""
        try:
            if self.cert_sha256 is not None:
                return pinned_context(self.cert_sha256, self.ca_file)
            if self.ca_file is not None:
                return ssl.create_default_context(cafile=str(self.ca_file))
        except OSError as exc:  # a missing CA file, or one that holds no certificate (ssl.SSLError): say which
            raise ValueError(f"{CA_FILE_ENV}={self.ca_file}: {exc}") from exc
        return True

    def verify_for(self, url: str) -> Verify:
        """`check_url(url)`, then `verify()`: what every client of the coordinator is built with."""
        self.check_url(url)
        return self.verify()

    def environment(self) -> dict[str, str]:
        """The variables that hand this trust to a child process (`relay-rl worker` -> services.rollout)."""
        env: dict[str, str] = {}
        if self.ca_file is not None:
            env[CA_FILE_ENV] = str(self.ca_file.resolve())
        if self.cert_sha256 is not None:
            env[CERT_SHA256_ENV] = self.cert_sha256
        if self.insecure_http:
            env[INSECURE_HTTP_ENV] = "1"
        return env


class _PinnedSocket(ssl.SSLSocket):
    """A blocking client socket (httpx's sync transport) that checks the pin as its handshake completes."""

    def do_handshake(self, block: bool = False) -> None:
        super().do_handshake(block)
        _check_pin(self.context, self.getpeercert(binary_form=True))


class _PinnedObject(ssl.SSLObject):
    """The same for a memory-BIO connection (asyncio/anyio, TLS through an https proxy)."""

    def do_handshake(self) -> None:
        super().do_handshake()  # raises SSLWantReadError until the handshake is done
        _check_pin(self.context, self.getpeercert(binary_form=True))


class PinnedContext(ssl.SSLContext):
    """A client context that accepts one server certificate, named by its SHA-256 (`pinned_sha256`)."""

    sslsocket_class = _PinnedSocket
    sslobject_class = _PinnedObject
    pinned_sha256: str = ""


def pinned_context(cert_sha256: str, ca_file: Path | None = None) -> PinnedContext:
    """A TLS client context for a pinned certificate. Without `ca_file` the chain and host name are not checked
    (a self-signed certificate is fine: the pin is the whole check); with it, both are checked as well."""
    context = PinnedContext(ssl.PROTOCOL_TLS_CLIENT)
    context.pinned_sha256 = normalize_sha256(cert_sha256)
    if ca_file is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(cafile=str(ca_file))
    return context


def _check_pin(context: ssl.SSLContext, der: bytes | None) -> None:
    expected = getattr(context, "pinned_sha256", "")
    if not expected:
        raise AssertionError("a pinned socket without a pin")
    seen = certificate_sha256(der) if der else "none"
    if seen != expected:
        raise CertificatePinError(
            f"the server's certificate has SHA-256 {seen}, not the pinned {expected} ({CERT_SHA256_ENV}): "
            "refusing to send anything to it"
        )
