"""One node of the broadcast benchmark, run inside its network namespace by the driver.

    python -m benchmarks.broadcast.node --role learner  --host IP --size-bytes N --chunk-size-bytes C
    python -m benchmarks.broadcast.node --role receiver --host IP

Both serve a ChunkStore with the real ChunkServer. The learner holds one random payload and publishes
it under a new version number per run; a receiver fetches a version with the real RelayFetcher (the
rollout worker's relay code: stream from its first source, verify and store every chunk, relay it
from its own chunk server, fail over on a dead, stalled or corrupt source), with no model.

Protocol: one JSON object per line. stdout: {"event": "ready", "url": ...} once serving, then one
answer per command. stdin commands:
    learner   {"cmd": "publish", "version": v}   -> {"event": "published", "manifest": <manifest JSON>}
    receiver  {"cmd": "fetch", "manifest": <manifest JSON>, "sources": [url, ...], "start_at": unix_s,
               "check_blob": bool}               -> {"event": "done", ...} or {"event": "failed", "error": ...}
    both      {"cmd": "quit"} (or end of input)  -> exit 0
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import numpy as np

from services.rollout.relay_fetch import RelayFetcher, RelayFetchError
from shared.chunk_server import ChunkServer, ChunkStore
from shared.signing import load_signing_key
from shared.weights import Manifest, build_manifest, sha256_hex, sign, verify_signature

SIGNING_KEY = load_signing_key("5" * 64)  # fixed: the learner node signs, receivers verify with PUBLIC_KEY
PUBLIC_KEY = SIGNING_KEY.public_key()
PORT = 8000


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


def serve_learner(args: argparse.Namespace) -> None:
    store = ChunkStore(keep_versions=4)
    server = ChunkServer(store, host=args.host, port=PORT, wait_s=args.chunk_wait_s).start()
    blob = np.random.default_rng(args.seed).bytes(args.size_bytes)
    template, chunks = build_manifest(
        blob, run_id="bench", policy_version=0, chunk_size_bytes=args.chunk_size_bytes, signing_key=SIGNING_KEY
    )
    emit({"event": "ready", "url": server.url, "size_bytes": len(blob), "num_chunks": template.num_chunks})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        manifest = sign(
            template.model_copy(update={"policy_version": command["version"], "created_at_s": time.time()}), SIGNING_KEY
        )
        store.put_version(manifest, chunks)  # the same bytes under a new version: no copy
        emit({"event": "published", "manifest": manifest.to_json().decode()})
    server.stop()


def serve_receiver(args: argparse.Namespace) -> None:
    store = ChunkStore(keep_versions=1)  # a new run's version evicts the last one
    server = ChunkServer(store, host=args.host, port=PORT, wait_s=args.chunk_wait_s).start()
    fetcher = RelayFetcher(
        store,
        own_url=server.url,
        stall_timeout_s=args.stall_timeout_s,
        manifest_wait_s=args.chunk_wait_s,
        version_timeout_s=600.0,
    )
    emit({"event": "ready", "url": server.url})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        emit(fetch_once(fetcher, command))
    fetcher.close()
    server.stop()


def fetch_once(fetcher: RelayFetcher, command: dict) -> dict:
    manifest = Manifest.from_json(command["manifest"])
    verify_signature(manifest, PUBLIC_KEY)
    sources = list(command["sources"])
    time.sleep(max(0.0, command["start_at"] - time.time()))  # every receiver starts at the same instant
    started_at_s = time.time()
    try:
        fetched = fetcher.fetch(manifest, lambda: sources)
    except RelayFetchError as exc:
        return {"event": "failed", "error": str(exc)}
    blob_ok = sha256_hex(fetched.blob) == manifest.blob_sha256 if command.get("check_blob") else None
    return {
        "event": "done",
        "version": manifest.policy_version,
        "started_at_s": started_at_s,
        "finished_at_s": started_at_s + fetched.seconds,
        "seconds": fetched.seconds,
        "num_bytes": fetched.num_bytes,
        "bytes_by_source": dict(fetched.bytes_by_source),
        "num_corrupt_chunks": fetched.num_corrupt_chunks,
        "failures": fetched.failures,
        "blob_ok": blob_ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.broadcast.node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--role", choices=["learner", "receiver"], required=True)
    parser.add_argument("--host", required=True, help="address to bind (the node's namespace address)")
    parser.add_argument("--size-bytes", type=int, default=256 << 20)
    parser.add_argument("--chunk-size-bytes", type=int, default=512 << 10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-wait-s", type=float, default=10.0)
    parser.add_argument("--stall-timeout-s", type=float, default=15.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.role == "learner":
        serve_learner(args)
    else:
        serve_receiver(args)


if __name__ == "__main__":
    main()
