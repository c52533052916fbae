"""Redis URLs with and without credentials: the local runner gives each trusted service a URL with its
own user in it; workers are handed a URL without any and get their user at registration. Both keep the
scheme (redis:// or rediss:// for TLS), the host, port, database and query parameters (ssl_ca_certs=...,
ssl_cert_reqs=...) exactly as given."""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit


def with_credentials(url: str, username: str, password: str) -> str:
    """`url` with `username:password@` as its user info (replacing any), both percent-encoded."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{quote(username, safe='')}:{quote(password, safe='')}@{_host_port(url)}"))


def without_credentials(url: str) -> str:
    """`url` with no user info."""
    return urlunsplit(urlsplit(url)._replace(netloc=_host_port(url)))


def _host_port(url: str) -> str:
    """The netloc after any user info, as written (IPv6 brackets and the port kept)."""
    return urlsplit(url).netloc.rpartition("@")[2]
