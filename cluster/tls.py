"""A run's own certificate authority and the coordinator's server certificate, so credentials cross only TLS.

    make_run_certificates(out_dir, hosts) -> TlsFiles
        out_dir/ca.pem       the run CA's certificate: what clients trust (RL_COORDINATOR_CA_FILE)
        out_dir/server.pem   the coordinator's certificate for every name and address in `hosts` (RL_TLS_CERT_FILE)
        out_dir/server.key   its private key, mode 0600 (RL_TLS_KEY_FILE)

The CA's private key signs the server certificate and is dropped: it is never written, so nothing can issue
another certificate this CA vouches for. A coordinator reached under another name needs a new set (and its
workers the new ca.pem). `TlsFiles.cert_sha256` is the server certificate's SHA-256, what a worker may pin
instead of trusting the CA (RL_COORDINATOR_CERT_SHA256). Keys are ECDSA P-256; the extensions are the ones a
strict verifier asks for (Python 3.13's default context sets VERIFY_X509_STRICT).

Who makes them: `relay-rl keys --tls-host NAME ...` and `relay-rl keys --compose` (cluster/cli.py),
deploy/make_secrets.py (the Helm chart's values) and the local runner with --tls (cluster/local.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.tls import CA_FILE_ENV, pem_certificate_sha256

CA_FILE = "ca.pem"
CERT_FILE = "server.pem"
KEY_FILE = "server.key"
DEFAULT_VALID_DAYS = 365
CLOCK_SKEW = datetime.timedelta(hours=1)  # valid from an hour ago: a worker whose clock runs behind accepts it


@dataclass(frozen=True)
class TlsFiles:
    """The three files of a run's TLS and the server certificate's fingerprint."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    cert_sha256: str  # 64 hex digits: sha256 of server.pem's certificate in DER

    def server_env(self) -> dict[str, str]:
        """The coordinator's variables (services/coordinator/settings.py)."""
        return {"RL_TLS_CERT_FILE": str(self.cert_file), "RL_TLS_KEY_FILE": str(self.key_file)}

    def client_env(self) -> dict[str, str]:
        """A worker's (or a tool's) variable: trust the run CA (shared/tls.py)."""
        return {CA_FILE_ENV: str(self.ca_file)}


def make_run_certificates(
    out_dir: Path, hosts: Sequence[str], *, valid_days: int = DEFAULT_VALID_DAYS, overwrite: bool = False
) -> TlsFiles:
    """A new CA and a server certificate for `hosts` (DNS names or IP addresses, the first one its common name)
    in `out_dir`. An existing file there is an error unless `overwrite`."""
    names = list(dict.fromkeys(host.strip() for host in hosts if host.strip()))
    if not names:
        raise ValueError("a server certificate needs at least one host name or address")
    if valid_days < 1:
        raise ValueError(f"valid_days must be at least 1, got {valid_days}")
    now = datetime.datetime.now(datetime.UTC)
    validity = _Validity(not_before=now - CLOCK_SKEW, not_after=now + datetime.timedelta(days=valid_days))
    ca_key = ec.generate_private_key(ec.SECP256R1())  # signs the server certificate, then is dropped
    ca_cert = _ca_certificate(ca_key, validity)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _server_certificate(server_key, names, ca_key, ca_cert, validity)

    out_dir.mkdir(parents=True, exist_ok=True)
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write((out_dir / KEY_FILE).resolve(), key_pem, 0o600, overwrite)
    _write((out_dir / CERT_FILE).resolve(), server_cert.public_bytes(serialization.Encoding.PEM), 0o644, overwrite)
    _write((out_dir / CA_FILE).resolve(), ca_cert.public_bytes(serialization.Encoding.PEM), 0o644, overwrite)
    return read_run_certificates(out_dir)


@dataclass(frozen=True)
class _Validity:
    """When a run's certificates are valid (both share it)."""

    not_before: datetime.datetime
    not_after: datetime.datetime


def _ca_certificate(ca_key: ec.EllipticCurvePrivateKey, validity: _Validity) -> x509.Certificate:
    """The run CA's self-signed certificate: it may sign server certificates only (path length 0)."""
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"relay-rl run CA {os.urandom(4).hex()}")])
    return (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity.not_before)
        .not_valid_after(validity.not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(digital_signature=False, key_cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _server_certificate(
    server_key: ec.EllipticCurvePrivateKey,
    names: list[str],
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    validity: _Validity,
) -> x509.Certificate:
    """The coordinator's certificate for `names` (the first its common name), signed by the run CA."""
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity.not_before)
        .not_valid_after(validity.not_after)
        .add_extension(x509.SubjectAlternativeName([_general_name(name) for name in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def read_run_certificates(out_dir: Path) -> TlsFiles:
    """The set in `out_dir` (FileNotFoundError naming the first file missing)."""
    paths = [(out_dir / name).resolve() for name in (CA_FILE, CERT_FILE, KEY_FILE)]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing")
    ca_file, cert_file, key_file = paths
    return TlsFiles(ca_file, cert_file, key_file, cert_sha256=pem_certificate_sha256(cert_file))


def existing_or_new_certificates(out_dir: Path, hosts: Sequence[str]) -> tuple[TlsFiles, bool]:
    """`make keys` on a folder that may hold a running cluster's set: (the set, whether it was made now). A whole
    set is kept as it is (its hosts unchecked); part of one is an error (remove the folder to make a new set)."""
    present = [name for name in (CA_FILE, CERT_FILE, KEY_FILE) if (out_dir / name).exists()]
    if len(present) == 3:
        return read_run_certificates(out_dir), False
    if present:
        raise ValueError(f"{out_dir} holds {', '.join(present)} but not the whole set: remove it to make a new one")
    return make_run_certificates(out_dir, hosts), True


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def _key_usage(*, digital_signature: bool, key_cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write(path: Path, data: bytes, mode: int, overwrite: bool) -> None:
    """Created with `mode` from the start (the key is never readable by others, even for a moment)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise FileExistsError(f"{path} exists (remove it, or its folder, to make a new set)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # an overwritten file keeps its old mode otherwise
