"""The HTTP chunk protocol, one definition for both ends: every holder of weights (the learner, and each
rollout worker for relaying) serves the artifacts it holds (server.py), and receivers fetch them
(client.py). A change of route, query or stream framing is made here.

An artifact is one policy version in one payload (`full` or `delta`, see manifest.py). Routes
(`<payload>` is `full` or `delta`; without it, `full`):
  GET /healthz                                        -> 200 "ok"
  GET /v1/weights/latest                              -> manifest of the newest complete full version (404 if none)
  GET /v1/weights/{v}[/<payload>]/manifest            -> manifest JSON (404 if not held)
  GET /v1/weights/{v}[/<payload>]/chunks/{i}          -> one verified chunk (404 unknown, 504 still missing
                                                         after wait_s without progress)
  GET /v1/weights/{v}/<payload>/stream?from=i         -> chunks i, i+1, ... to the end in one response, each
                                                         forwarded as its bytes arrive and followed by its
                                                         verdict byte (the relay path)
Query `manifest=<sha256>` on chunk and stream requests pins the artifact: 409 if the holder has a
different manifest under that version (a restarted learner re-used the number). `wait_manifest_s` on a
stream bounds the wait for an artifact not held yet (default and cap: the holder's `wait_s`). A stream
whose artifact makes no progress at the holder for `wait_s` ends early (the connection closes
mid-body): the child sees a short read and moves to another holder.

Stream framing: each chunk's bytes (exactly `Manifest.chunk_length(i)`), then one verdict byte:
STREAM_VERIFIED when the sender verified exactly those bytes, STREAM_REJECTED when they failed its
check (or a later receipt replaced them). The receiver reads in pieces of RELAY_PIECE_BYTES and
reports each to its own store, which forwards it to its children at once (cut-through: a hop costs a
piece, not a chunk).

The learner announces a manifest by its URL (`WeightsPublished.manifest_url`, `manifest_path`);
`announced_source` reads the holder and the payload back from it.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from shared.messages import WeightsPublished
from shared.weight_channel.manifest import Manifest, Payload, WeightsError, as_payload

HEALTH_PATH = "/healthz"
HEALTH_BODY = b"ok"  # what a holder answers there (the coordinator's connect-back probe checks it)
LATEST_PATH = "/v1/weights/latest"
_ARTIFACT = r"^/v1/weights/(\d+)(?:/(full|delta))?"
MANIFEST_ROUTE = re.compile(_ARTIFACT + r"/manifest$")
CHUNK_ROUTE = re.compile(_ARTIFACT + r"/chunks/(\d+)$")
STREAM_ROUTE = re.compile(r"^/v1/weights/(\d+)/(full|delta)/stream$")
_ANNOUNCED_MANIFEST = re.compile(r"^(https?://.+?)/v1/weights/(\d+)(?:/(full|delta))?/manifest$")

STREAM_VERIFIED = b"\x01"  # after a chunk in a stream: the sender verified exactly these bytes
STREAM_REJECTED = b"\x00"  # they failed the sender's check (or were replaced): discard, fetch the chunk again
RELAY_PIECE_BYTES = 128 * 1024  # cut-through granularity: 5 ms at 200 Mbit/s, ~200 reports/s per receiver
MAX_NUMBER_DIGITS = 18  # a version or chunk index in a URL: below 2**63, far above any real one


class AnnouncementError(WeightsError):
    """The announcement and the manifest it points to disagree, or the announcement is unusable."""


def manifest_path(policy_version: int | None, payload: Payload | None = None) -> str:
    """Route of a manifest: the holder's newest full version (None), or version v's full/delta payload."""
    if policy_version is None:
        return LATEST_PATH
    return (
        f"/v1/weights/{policy_version}/manifest"
        if payload is None
        else f"/v1/weights/{policy_version}/{payload}/manifest"
    )


def chunk_path(manifest: Manifest, index: int) -> str:
    """Route of one chunk, pinned to `manifest`."""
    return f"/v1/weights/{manifest.artifact}/chunks/{index}?manifest={manifest.sha256()}"


def stream_path(manifest: Manifest, first: int, wait_manifest_s: float, requester_url: str = "") -> str:
    """Route of the stream of chunks `first`.. of `manifest`'s artifact, pinned to it. `requester_url`: the
    asking worker's own chunk server (`holder=`): a holder whose own copy is coming from that very worker
    ends the stream at once instead of waiting on it (a relay cycle, server.py)."""
    holder = f"&holder={quote(requester_url, safe='')}" if requester_url else ""
    return (
        f"/v1/weights/{manifest.artifact}/stream"
        f"?from={first}&manifest={manifest.sha256()}&wait_manifest_s={wait_manifest_s}{holder}"
    )


def announced_source(announcement: WeightsPublished) -> tuple[str, Payload | None]:
    """The announcing chunk server's base URL and the payload announced (None: the legacy route, full),
    from `manifest_url` = `<base>/v1/weights/<v>[/<payload>]/manifest`."""
    match = _ANNOUNCED_MANIFEST.match(announcement.manifest_url)
    if match is None:
        raise AnnouncementError(
            f"manifest_url {announcement.manifest_url!r} is not <http(s) base>/v1/weights/<v>[/<payload>]/manifest"
        )
    if int(match[2]) != announcement.policy_version:
        raise AnnouncementError(
            f"manifest_url {announcement.manifest_url!r} does not name version {announcement.policy_version}"
        )
    return match[1], as_payload(match[3]) if match[3] else None
