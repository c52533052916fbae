"""What Ed25519 manifests cost against the HMAC-SHA256 they replaced: sign and verify time per manifest.

    python -m benchmarks.manifest_signing            # writes benchmarks/results/manifest_signing.json

Two manifest sizes: the demo's policy (124k parameters in float32: 8 chunks of 64 KiB) and Qwen3-0.6B
in bf16 (1.2 GB in 1 MiB chunks: 1,145 chunk hashes, a ~80 KB canonical body). "sign" is what the
learner does per published artifact (canonical body + signature), "verify" what every receiver does
per manifest (canonical body + check). The old HMAC path is timed on the same body, as it was:
hmac.new(key, body, sha256) and compare_digest. Best of `--repeat` runs of `--number` calls each.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import platform
import timeit
from pathlib import Path

from benchmarks.result_file import write_result
from shared.signing import generate_key_pair, load_signing_key
from shared.weight_channel import Manifest, verify_signature
from shared.weight_channel.manifest import DEFAULT_HASH_ALGORITHM, payload_digest, sha256_hex, sign

RESULTS = Path(__file__).resolve().parent / "results" / "manifest_signing.json"
SHAPES = {  # name -> (payload bytes, chunk bytes)
    "demo_124k_params_fp32": (124_000 * 4, 64 * 1024),
    "qwen3_0.6b_bf16": (1_200_000_000, 1024 * 1024),
}


def manifest_of(total_size_bytes: int, chunk_size_bytes: int) -> Manifest:
    """A full manifest with real-looking digests, without hashing gigabytes: only the body's size matters."""
    num_chunks = -(-total_size_bytes // chunk_size_bytes)
    digests = [sha256_hex(index.to_bytes(8, "little") + os.urandom(8)) for index in range(num_chunks)]
    digest = payload_digest(DEFAULT_HASH_ALGORITHM, total_size_bytes, chunk_size_bytes, digests)
    return Manifest(
        run_id="bench",
        policy_version=7,
        total_size_bytes=total_size_bytes,
        chunk_size_bytes=chunk_size_bytes,
        chunk_digests=digests,
        digest=digest,
        full_size_bytes=total_size_bytes,
        full_digest=digest,
        created_at_s=0.0,
    )


def best_us(call: object, number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6  # type: ignore[arg-type]


def measure(manifest: Manifest, number: int, repeat: int) -> dict[str, float]:
    signing_key = load_signing_key(generate_key_pair().signing_key_hex)
    public_key = signing_key.public_key()
    signed = sign(manifest, signing_key)
    hmac_key = os.urandom(32)
    hmac_signature = hmac.new(hmac_key, signed.body_bytes(), hashlib.sha256).hexdigest()

    def hmac_sign() -> str:
        return hmac.new(hmac_key, manifest.body_bytes(), hashlib.sha256).hexdigest()

    def hmac_verify() -> bool:
        expected = hmac.new(hmac_key, signed.body_bytes(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, hmac_signature)

    return {
        "num_chunks": manifest.num_chunks,
        "body_bytes": len(signed.body_bytes()),
        "body_only_us": best_us(signed.body_bytes, number, repeat),
        "ed25519_sign_us": best_us(lambda: sign(manifest, signing_key), number, repeat),
        "ed25519_verify_us": best_us(lambda: verify_signature(signed, public_key), number, repeat),
        "hmac_sign_us": best_us(hmac_sign, number, repeat),
        "hmac_verify_us": best_us(hmac_verify, number, repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.manifest_signing", description=__doc__)
    parser.add_argument("--number", type=int, default=200, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs; the best is reported")
    args = parser.parse_args()
    results = {}
    for name, (total_size_bytes, chunk_size_bytes) in SHAPES.items():
        number = args.number if total_size_bytes < 10**8 else max(1, args.number // 20)
        results[name] = measure(manifest_of(total_size_bytes, chunk_size_bytes), number, args.repeat)
        print(name, json.dumps({key: round(value, 1) for key, value in results[name].items()}), flush=True)
    write_result(
        RESULTS,
        {
            "command": "python -m benchmarks.manifest_signing",
            "machine": platform.processor() or platform.machine(),
            "results": results,
        },
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
