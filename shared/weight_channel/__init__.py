"""The weight channel: how a policy version goes from the learner to every rollout worker's engine
(docs/weight_path.md is its map). Publish and follow are its two verbs; the learner, workers, the
coordinator and the engines use the names below and nothing else of it.

    the learner      WeightPublisher.publish(tensors, version): serialise once into the served buffer,
                     hash, sign, store, announce on `weights`; ChunkStore + ChunkServer serve it
    a worker         WeightFollower.fetch_verified(announcement): the signed manifest, the chunks
                     streamed from its relay parent into its own ChunkStore (its ChunkServer relays
                     them on at once), every chunk verified, a delta rebuilt -> VerifiedVersion
    the coordinator  plan_relay and its types: who fetches from whom; announced_source: whose
                     chunk server an announcement names; holder_answers: whether a worker's chunk
                     server can be reached from the coordinator (its connect-back probe)
    the engines      parse_blob (the safetensors layout, zero copy) and the fit checks
                     (check_state_fits, check_adapter_fits), raising WeightsLoadError

Inside, one module per concern:
    manifest.py      the signed Manifest (schema 4), digests, sign/verify, the errors
    lora.py          a LoRA version's adapter description (signed into the manifest) and its file layout
    layout.py        the safetensors bytes: written by the learner, parsed by the engines
    fit.py           the engines' checks of parsed weights against their model
    delta.py         delta codecs (a version as the difference from its base)
    buffers.py       version-sized buffers, faulted in between versions
    store.py         ChunkStore: the artifacts a holder has, verified chunk by chunk
    protocol.py      the HTTP chunk protocol: routes, stream framing, the announcement's URL
    server.py        ChunkServer: the protocol's serving end (routes, cut-through stream, limits)
    client.py        the protocol's fetching end (single requests, ChunkStream)
    relay_fetch.py   one artifact fetched from the best holder, routing around failures
    relay_plan.py    the relay plan (pure)
    publisher.py     the learner's side
    follower.py      the worker's side
    chunk_sizing.py  the chunk-size rule (`python -m shared.weight_channel.chunk_sizing`)

The keys that sign manifests are shared/signing.py's (deployment secrets with their own CLI); this
package signs and verifies with them. Nothing here imports torch at import time.
"""

from shared.weight_channel.client import holder_answers
from shared.weight_channel.fit import TIED_OUTPUT_KEY, check_adapter_fits, check_state_fits
from shared.weight_channel.follower import ParentLookup, VerifiedVersion, WeightFollower
from shared.weight_channel.layout import WeightsLoadError, parse_blob, safetensors_size, write_safetensors
from shared.weight_channel.lora import ADAPTER_CONFIG_FILE, ADAPTER_FILE, PEFT_PREFIX, LoraAdapter, base_fingerprint
from shared.weight_channel.manifest import (
    Buffer,
    Manifest,
    ManifestError,
    ModelMismatchError,
    WeightsError,
    check_model_fingerprint,
    verify_signature,
)
from shared.weight_channel.protocol import RELAY_PIECE_BYTES, announced_source, manifest_path
from shared.weight_channel.publisher import PublishedVersion, WeightPublisher
from shared.weight_channel.relay_plan import (
    LEARNER,
    Delivery,
    ParentObservation,
    RelayCandidate,
    RelayPlan,
    deliveries,
    plan_relay,
)
from shared.weight_channel.server import ChunkServer
from shared.weight_channel.store import ChunkStore

__all__ = [
    # the learner
    "ChunkServer",
    "ChunkStore",
    "PublishedVersion",
    "WeightPublisher",
    # a worker
    "ParentLookup",
    "VerifiedVersion",
    "WeightFollower",
    # the coordinator
    "LEARNER",
    "Delivery",
    "ParentObservation",
    "RelayCandidate",
    "RelayPlan",
    "announced_source",
    "deliveries",
    "holder_answers",
    "plan_relay",
    # the engines (and the learner's own serialiser)
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_FILE",
    "PEFT_PREFIX",
    "TIED_OUTPUT_KEY",
    "LoraAdapter",
    "WeightsLoadError",
    "base_fingerprint",
    "check_adapter_fits",
    "check_state_fits",
    "parse_blob",
    "safetensors_size",
    "write_safetensors",
    # the manifest and its errors (tools that check a learner's newest version: cluster/remote_worker.py)
    "Buffer",
    "Manifest",
    "ManifestError",
    "ModelMismatchError",
    "WeightsError",
    "check_model_fingerprint",
    "manifest_path",
    "verify_signature",
    # the cut-through piece size (benchmarks model a hop's cost with it)
    "RELAY_PIECE_BYTES",
]
