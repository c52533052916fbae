"""One node of the broadcast benchmark, run inside its network namespace by the driver, running the
project's real code end to end.

    python -m benchmarks.broadcast.node --role learner  --host IP --redis-url URL --size-bytes N
    python -m benchmarks.broadcast.node --role receiver --host IP --redis-url URL --run-id R

learner   a torch module of random bf16 tensors (`--size-bytes` in all), a ChunkStore served by the
          real ChunkServer, and the real WeightPublisher (shared/weight_channel/publisher.py) over a StreamBus
          on the learner's Redis: serialise, hash, chunk, sign, store, announce on `weights`.
receiver  the real WeightsSync (services/rollout/weights_sync.py) with `start()`: its own thread reads
          the announcement from the learner's Redis over the emulated link, fetches and checks the
          manifest, streams the chunks from its parent (RelayFetcher), verifies and relays them from
          its own ChunkServer, and calls `on_ready` with the verified full weights.

Protocol: one JSON object per line. stdout: {"event": "up", "url": ...} once serving, then one answer
per command, and (receiver) one {"event": "ready", ...} per version from the sync thread. stdin:
    learner   {"cmd": "publish", "run_id": r, "version": v} -> {"event": "published", started_at_s, publish_s, ...}
    receiver  {"cmd": "arm"}  -> {"event": "armed"}: CPU time is counted from here (just before the publish)
              {"cmd": "load"} -> {"event": "loaded", "pause_s": s}: the ready version into a torch module
    both      {"cmd": "quit"} (or end of input) -> exit 0
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from services.rollout.announcement_client import StreamAnnouncements
from shared.bus import StreamBus, connect
from shared.keys import RunKeys
from shared.signing import load_signing_key
from shared.weight_channel import ChunkServer, ChunkStore, WeightFollower

SIGNING_KEY = load_signing_key("5" * 64)  # fixed: the learner node signs, receivers verify with PUBLIC_KEY
PUBLIC_KEY = SIGNING_KEY.public_key()
PORT = 8000
ROW_BYTES = 4096 * 2  # one bf16 row of a (rows, 4096) weight
MAX_ROWS = 4096  # a tensor is at most (4096, 4096) bf16 = 32 MiB, like a 7B model's projections

_emit_lock = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    with _emit_lock:  # the sync thread's `ready` and the command answers share stdout
        print(json.dumps(event), flush=True)


def cpu_s() -> float:
    """User + system CPU seconds of this process, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tensor_shapes(size_bytes: int) -> list[tuple[int, int]]:
    """(rows, 4096) bf16 shapes summing to `size_bytes` (rounded down to a row)."""
    num_rows = size_bytes // ROW_BYTES
    if num_rows < 1:
        raise ValueError(f"--size-bytes must be at least {ROW_BYTES}, got {size_bytes}")
    shapes = [(MAX_ROWS, 4096)] * (num_rows // MAX_ROWS)
    if num_rows % MAX_ROWS:
        shapes.append((num_rows % MAX_ROWS, 4096))
    return shapes


def safetensors_file_bytes(size_bytes: int) -> int:
    """The size of the safetensors file the learner publishes for `make_model(size_bytes)`: what a
    receiver's buffer for a version is (computed on meta tensors: no memory)."""
    import torch

    from shared.weight_channel import safetensors_size

    meta = {
        f"weights.{index}": torch.empty(shape, dtype=torch.bfloat16, device="meta")
        for index, shape in enumerate(tensor_shapes(size_bytes))
    }
    return safetensors_size(meta)


def make_model(size_bytes: int, fill: bool) -> Any:
    """A module whose state dict is bf16 tensors of `tensor_shapes(size_bytes)`; `config` carries what
    serialize_weights reads. `fill`: random values (the learner), else zeros (a receiver's engine)."""
    import torch

    class BenchModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(tie_word_embeddings=False)
            self.weights = torch.nn.ParameterList(
                torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16), requires_grad=False)
                for shape in tensor_shapes(size_bytes)
            )

    model = BenchModel()
    generator = torch.Generator().manual_seed(0)
    for parameter in model.weights:
        if fill:
            parameter.data.normal_(generator=generator)
        else:  # touch every page: an engine's weights are resident, a load must not time page faults
            parameter.data.zero_()
    return model


def serve_learner(args: argparse.Namespace) -> None:
    import torch

    from services.learner.publish import publication_state
    from shared.weight_channel import WeightPublisher

    # as the learner keeps them: every version in a file of its spill folder, served from a mapping of it
    store = ChunkStore(keep_versions=2, spill_dir=Path(args.spill_dir) if args.spill_dir else None)
    server = ChunkServer(store, host=args.host, port=PORT, wait_s=args.chunk_wait_s).start()
    client = connect(args.redis_url)
    model = make_model(args.size_bytes, fill=True)
    publisher: WeightPublisher | None = None  # one per run id (every scenario is its own run), newest only
    warm_up(
        store, model, args
    )  # steady state: the buffer of the next version is faulted in (shared/weight_channel/buffers.py)
    emit({"event": "up", "url": server.url})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        if command["cmd"] == "cpu":
            emit({"event": "cpu", "cpu_s": cpu_s()})
            continue
        run_id = command["run_id"]
        if publisher is None or publisher.keys.run_id != run_id:  # the old one's last blob is dropped
            if publisher is not None:
                publisher.close()
            bus = StreamBus(client, RunKeys(run_id), service="learner")
            publisher = WeightPublisher(
                bus,
                RunKeys(run_id),
                store,
                public_url=server.url,
                signing_key=SIGNING_KEY,
                chunk_size_bytes=args.chunk_size_bytes,
                full_every=1,
            )
        with torch.no_grad():  # "the optimizer step": new values, outside the timed window
            for parameter in model.weights:
                parameter[0].normal_()
        started_at_s = time.time()  # the window opens: serialise, hash, chunk, sign, store, announce
        published = publisher.publish(publication_state(model), command["version"])
        emit(
            {
                "event": "published",
                "started_at_s": started_at_s,
                "publish_s": published.publish_s,
                "published_at_s": published.announcement.published_at_s,
                "total_size_bytes": published.announcement.total_size_bytes,
                "num_chunks": published.announcement.num_chunks,
            }
        )
    server.stop()


def serve_receiver(args: argparse.Namespace) -> None:
    from services.rollout.weights_sync import WeightsSync
    from shared.weight_channel import VerifiedVersion

    # a new version evicts the last one; file mode (vLLM): full versions are received into files there
    spill_dir = Path(args.weights_dir) if args.receive_into == "file" else None
    store = ChunkStore(keep_versions=1, trusted_key=PUBLIC_KEY, spill_dir=spill_dir)
    if args.steady_state:  # as a worker that held the previous version: the next one's buffer is faulted in
        store.spares.prepare(safetensors_file_bytes(args.size_bytes), spill_dir)
        store.spares.wait()
    server = ChunkServer(store, host=args.host, port=PORT, wait_s=args.chunk_wait_s).start()
    bus = StreamBus(connect(args.redis_url), RunKeys(args.run_id), service="rollout")
    holders: list[str] = json.loads(args.holders)  # the relay plan's parent and fallbacks; [] = the learner only
    armed_cpu_s = cpu_s()
    newest: list[VerifiedVersion] = []

    def on_ready(version: VerifiedVersion) -> None:
        newest[:] = [version]
        emit(
            {
                "event": "ready",
                "version": version.policy_version,
                "published_at_s": version.announcement.published_at_s,
                "fetch_started_at_s": version.fetch_started_at_s,
                "transfer_done_at_s": version.transfer_done_at_s,
                "ready_at_s": version.ready_at_s,
                "num_bytes": version.num_bytes_downloaded,
                "source_url": version.source_url,
                "cpu_s": cpu_s() - armed_cpu_s,
                "path": str(getattr(version, "path", "") or ""),
            }
        )

    sync = WeightsSync(
        StreamAnnouncements(bus),  # the node reads the stream itself: no coordinator in this benchmark
        WeightFollower(
            store,
            PUBLIC_KEY,
            run_id=args.run_id,
            parents=lambda learner_url: holders,
            own_url=server.url,
            chunk_wait_s=args.chunk_wait_s,
            stall_timeout_s=args.stall_timeout_s,
            version_timeout_s=600.0,
        ),
        on_ready=on_ready,
    )
    sync.start()
    emit({"event": "up", "url": server.url})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        if command["cmd"] == "arm":
            armed_cpu_s = cpu_s()
            emit({"event": "armed"})
        elif command["cmd"] == "load":
            emit({"event": "loaded", "pause_s": load_into_model(newest[0], args)})
    sync.close()
    server.stop()


def warm_up(store: ChunkStore, model: Any, args: argparse.Namespace) -> None:
    """One untimed publication under a run nobody follows, so the timed ones find what a running learner
    has: a buffer for the version faulted in while it trained (shared/weight_channel/buffers.py)."""
    from services.learner.publish import publication_state
    from shared.weight_channel import WeightPublisher

    if not args.steady_state:
        return
    keys = RunKeys("bench-warm-up")
    publisher = WeightPublisher(
        StreamBus(connect(args.redis_url), keys, service="learner"),
        keys,
        store,
        public_url="http://warm-up.invalid",
        signing_key=SIGNING_KEY,
        chunk_size_bytes=args.chunk_size_bytes,
    )
    publisher.publish(publication_state(model), 0)
    publisher.close()
    store.spares.wait()


def load_into_model(version: Any, args: argparse.Namespace) -> float:
    """Seconds to load the ready version into a torch module of the learner's shapes: the time a torch
    engine does not generate (services/learner/publish.load_weights_blob, the engine's path). From the
    file in file mode (what vLLM reads)."""
    from safetensors.torch import load_file

    from services.learner.publish import load_weights_blob

    model = make_model(args.size_bytes, fill=False)  # torch imported and memory allocated before the clock
    started_s = time.perf_counter()
    if args.receive_into == "file":
        missing, unexpected = model.load_state_dict(load_file(str(version.path)), strict=False)
        if missing or unexpected:
            raise ValueError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    else:
        load_weights_blob(model, version.blob)
    return time.perf_counter() - started_s


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.broadcast.node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--role", choices=["learner", "receiver"], required=True)
    parser.add_argument("--host", required=True, help="address to bind (the node's namespace address)")
    parser.add_argument("--redis-url", required=True, help="the learner's Redis, at its namespace address")
    parser.add_argument("--run-id", default="bench", help="receiver: the run (scenario) whose `weights` it follows")
    parser.add_argument("--holders", default="[]", help="receiver: JSON list of parent and fallback URLs")
    parser.add_argument("--size-bytes", type=int, default=256 << 20, help="the model's bf16 bytes")
    parser.add_argument("--chunk-size-bytes", type=int, default=512 << 10)
    parser.add_argument("--chunk-wait-s", type=float, default=10.0)
    parser.add_argument("--stall-timeout-s", type=float, default=15.0)
    parser.add_argument("--receive-into", choices=["memory", "file"], default="memory")
    parser.add_argument("--weights-dir", default="", help="receiver, file mode: where the safetensors file goes")
    parser.add_argument("--spill-dir", default="", help="learner: its store's spill folder (empty: memory)")
    parser.add_argument(
        "--cold",
        dest="steady_state",
        action="store_false",
        help="no warm-up: buffers are faulted in inside the window (a process's very first version)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.role == "learner":
        serve_learner(args)
    else:
        serve_receiver(args)


if __name__ == "__main__":
    main()
