"""Redis URLs with and without credentials: the local runner gives each trusted service a URL with its
own user in it; workers are handed a URL without any and get their user at registration. Both keep the
scheme (redis:// or rediss:// for TLS), the host, port, database and the query parameters that carry no
secret (ssl_ca_certs=..., ssl_cert_reqs=...) exactly as given.

A credential can hide in the query as well as in the user info: redis-py passes every query parameter it
does not know as a keyword of the connection, so `?password=...` logs in as surely as `user:pw@` does.
Every parameter whose name says it carries one (`CREDENTIAL_WORDS`: password, ssl_password, username,
token, ...) is dropped by both functions."""

from __future__ import annotations

from urllib.parse import quote, unquote_plus, urlsplit, urlunsplit

# a query parameter whose name (lower-cased) contains one of these carries a credential
CREDENTIAL_WORDS = ("password", "passwd", "pwd", "secret", "token", "auth", "credential", "user")


def with_credentials(url: str, username: str, password: str) -> str:
    """`url` with `username:password@` as its user info (replacing any), both percent-encoded, and no
    credential-bearing query parameter."""
    parts = urlsplit(without_credentials(url))
    user_info = f"{quote(username, safe='')}:{quote(password, safe='')}@"
    return urlunsplit(parts._replace(netloc=user_info + parts.netloc))


def without_credentials(url: str) -> str:
    """`url` with no user info and no credential-bearing query parameter (the others kept in order)."""
    parts = urlsplit(url)
    kept = [pair for pair in parts.query.split("&") if pair and not is_credential_parameter(pair.partition("=")[0])]
    return urlunsplit(parts._replace(netloc=_host_port(url), query="&".join(kept)))


def is_credential_parameter(name: str) -> bool:
    """Whether a query parameter named `name` (as written: percent-encoding is undone) carries a credential."""
    lowered = unquote_plus(name).lower()
    return any(word in lowered for word in CREDENTIAL_WORDS)


def _host_port(url: str) -> str:
    """The netloc after any user info, as written (IPv6 brackets and the port kept)."""
    return urlsplit(url).netloc.rpartition("@")[2]
