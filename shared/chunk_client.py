"""Fetching a policy version chunk by chunk over HTTP, verifying everything before it is used.

The manifest's signature is checked against the cluster key first; each chunk is checked against
the manifest's sha256 as it arrives (and stored in an optional local ChunkStore, which is what lets
this holder relay it to its own children); the reassembled blob is checked last.
"""

from __future__ import annotations

import httpx

from shared.chunk_server import ChunkStore
from shared.weights import Manifest, WeightsError, assemble, verify_chunk, verify_signature


class FetchError(WeightsError):
    """The source could not deliver (connection refused, timeout, HTTP error)."""


def fetch_manifest(client: httpx.Client, base_url: str, policy_version: int | None, cluster_key: bytes) -> Manifest:
    """The signed manifest of `policy_version` (or the source's newest complete version when None)."""
    path = "/v1/weights/latest" if policy_version is None else f"/v1/weights/{policy_version}/manifest"
    body = _get(client, base_url + path)
    manifest = Manifest.from_json(body)
    verify_signature(manifest, cluster_key)
    if policy_version is not None and manifest.policy_version != policy_version:
        raise FetchError(f"{base_url} answered version {manifest.policy_version} for {policy_version}")
    return manifest


def fetch_chunk(client: httpx.Client, base_url: str, manifest: Manifest, index: int) -> bytes:
    data = _get(client, f"{base_url}/v1/weights/{manifest.policy_version}/chunks/{index}")
    verify_chunk(manifest, index, data)
    return data


def fetch_version(
    client: httpx.Client, base_url: str, manifest: Manifest, store: ChunkStore | None = None
) -> bytes:
    """Every chunk of `manifest` from `base_url`, verified; the blob, verified whole."""
    if store is not None:
        store.add_manifest(manifest)
    chunks: list[bytes] = []
    for index in range(manifest.num_chunks):
        chunk = fetch_chunk(client, base_url, manifest, index)
        if store is not None:
            store.put_chunk(manifest.policy_version, index, chunk)
        chunks.append(chunk)
    return assemble(manifest, chunks)


def _get(client: httpx.Client, url: str) -> bytes:
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise FetchError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise FetchError(f"GET {url}: HTTP {response.status_code}: {response.text[:200]}")
    return response.content
