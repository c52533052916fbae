"""Relay parents that lie (benchmarks/lying_parents.py), and what each costs its children: the lag of a
child of the liar, and of that child's own child, version after version, against an honest parent in the
same run (issue 35, item 5).

    python -m benchmarks.relay_liars [--label after] [--versions 8]   # writes benchmarks/results/relay_liars.json

Four scenarios, the same fleet each: a learner and three workers in this process, each a real chunk store,
chunk server and relay fetcher on localhost (no link emulation: a transfer takes tens of ms, so a lag is
almost all time spent on a bad source). The parent under test claims 10 Gbit/s, the child 1 Gbit/s, the
grandchild 500 Mbit/s: the first plan chains learner -> parent -> child -> grandchild. The parent is honest,
or lies one of the three ways. Every version the plan is recomputed (shared/weight_channel/relay_plan.py
`plan_relay`) from what the children reported of their parents on earlier versions, as the coordinator
does: `ParentObservation.missed` is the miss rule (the heartbeat script applies the same), so whether the
liar keeps its children is the code's own answer. Timeouts are the run file's defaults / 10.
Then the two hand-written liars (dribbled_head, disowned_repair), one version each, as a lone child's
parent: its lag, or that it was still fetching after HELD_CAP_S (then the liar is closed, which ends it).

Timed window, per worker per version: from the learner's store holding the whole version (its publication
done; the announcement would follow) to that worker's RelayFetcher returning with every chunk verified in
its store. Inside: waiting on and leaving bad sources, repairs, the transfer. Outside: the manifest fetch
and its signature check (the fetcher is handed the manifest), the plan lookup, the swap.

`--label before` measures the weight channel of the commit named in the entry, before the fix (run from a
copy of the tree holding that commit's shared/weight_channel/ and heartbeat rule); `--label after` (the
default) the working tree. Each run replaces its own label's entry and keeps the other's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lying_parents import HandWrittenParent, LyingParentStore, ParentLie, disowned_repair, dribbled_head
from benchmarks.result_file import write_result
from shared.signing import generate_key_pair, load_public_key, load_signing_key
from shared.weight_channel import ChunkServer, ChunkStore, Delivery, Manifest, ParentObservation, RelayCandidate
from shared.weight_channel.manifest import build_manifest
from shared.weight_channel.relay_fetch import ArtifactFetch, RelayFetcher, RelayFetchError
from shared.weight_channel.relay_plan import LEARNER, deliveries, plan_relay

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results" / "relay_liars.json"
KEYS = generate_key_pair()
SIGNING_KEY, PUBLIC_KEY = load_signing_key(KEYS.signing_key_hex), load_public_key(KEYS.public_key_hex)
CLAIMS_MBPS = {"parent": 10_000.0, "child": 1_000.0, "grandchild": 500.0}  # the first plan: one chain
HAND_WRITTEN = ("dribbled_head", "disowned_repair")  # liars found on the way (benchmarks/lying_parents.py)
HELD_CAP_S = 20.0  # a child still fetching after this is reported held (past its 12 s version timeout)


@dataclasses.dataclass(frozen=True)
class Settings:
    chunk_size_bytes: int = 256 * 1024
    num_chunks: int = 40  # 10 MiB a version; 60% of it is 24 whole chunks
    stall_timeout_s: float = 1.5  # [broadcast] defaults / 10
    chunk_wait_s: float = 1.0
    version_timeout_s: float = 12.0
    num_versions: int = 8


class Node:
    """One worker's relay side: its store, the chunk server over it and the fetcher that fills it."""

    def __init__(self, name: str, store: ChunkStore, settings: Settings) -> None:
        self.name = name
        self.store = store
        self.server = ChunkServer(store, wait_s=settings.chunk_wait_s).start()
        self.fetcher = RelayFetcher(
            store,
            own_url=self.server.url,
            stall_timeout_s=settings.stall_timeout_s,
            manifest_wait_s=settings.chunk_wait_s,
            version_timeout_s=settings.version_timeout_s,
        )
        self.result: ArtifactFetch | RelayFetchError | None = None
        self.done_s = 0.0  # monotonic: the fetch returned

    def fetch(self, manifest: Manifest, sources: list[str]) -> threading.Thread:
        def run() -> None:
            try:
                self.result = self.fetcher.fetch(manifest, lambda: sources)
            except RelayFetchError as exc:  # a failed version is a result here, not a crash
                self.result = exc
            self.done_s = time.monotonic()

        thread = threading.Thread(target=run, name=f"fetch-{self.name}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        if isinstance(self.store, LyingParentStore):
            self.store.release()  # its stalled handler threads return before the server goes
        self.fetcher.close()
        self.server.stop()


def new_version(policy_version: int, settings: Settings) -> tuple[Manifest, list[memoryview]]:
    blob = np.random.default_rng(policy_version).bytes(settings.num_chunks * settings.chunk_size_bytes)
    return build_manifest(
        blob,
        run_id="relay-liars",
        policy_version=policy_version,
        chunk_size_bytes=settings.chunk_size_bytes,
        signing_key=SIGNING_KEY,
    )


def run_scenario(lie: ParentLie | None, settings: Settings) -> dict[str, Any]:
    """`num_versions` versions through the fleet with this parent; per version, each worker's lag and source."""
    learner = ChunkServer(ChunkStore(), wait_s=settings.chunk_wait_s).start()
    parent_store = ChunkStore(trusted_key=PUBLIC_KEY) if lie is None else LyingParentStore(lie, trusted_key=PUBLIC_KEY)
    nodes = {
        "parent": Node("parent", parent_store, settings),
        "child": Node("child", ChunkStore(trusted_key=PUBLIC_KEY), settings),
        "grandchild": Node("grandchild", ChunkStore(trusted_key=PUBLIC_KEY), settings),
    }
    url_of = {name: node.server.url for name, node in nodes.items()}
    observations: dict[str, ParentObservation] = {}
    misses: dict[str, tuple[int, int]] = {}
    versions = []
    try:
        warm_up, chunks = new_version(0, settings)  # untimed: every worker holds a version (a liar's material)
        learner.store.put_version(warm_up, chunks, verified=True)
        for thread in [node.fetch(warm_up, [learner.url]) for node in nodes.values()]:
            thread.join()
        for version in range(1, settings.num_versions + 1):
            by_url = deliveries(list(observations.values()), misses)
            candidates = [
                RelayCandidate(name, url_of[name], CLAIMS_MBPS[name], delivery=by_url.get(url_of[name], Delivery()))
                for name in nodes
            ]
            plan = plan_relay(candidates, current_version=version)
            manifest, chunks = new_version(version, settings)
            published_s = time.monotonic()
            learner.store.put_version(manifest, chunks, verified=True)
            threads = []
            for name, node in nodes.items():
                assignment = plan.assignments[name]
                first = assignment.parent_url or learner.url
                threads.append(node.fetch(manifest, [first, *assignment.fallback_urls, learner.url]))
            for thread in threads:
                thread.join(settings.version_timeout_s + 10.0)
                assert not thread.is_alive(), "a fetch outlived its version timeout"
            row: dict[str, Any] = {"policy_version": version}
            for name, node in nodes.items():
                parent_id = plan.assignments[name].parent_id
                row[name] = outcome(node, published_s, parent_id, url_of)
                if parent_id != LEARNER and isinstance(node.result, ArtifactFetch):
                    fetched = node.result
                    seen = ParentObservation(
                        name, version, fetched.parent_url, fetched.parent_bytes, fetched.num_bytes, row[name]["lag_s"]
                    )
                    observations[name] = seen
                    if seen.missed:  # the heartbeat script's count (services/coordinator/heartbeat_batch.py)
                        _, count = misses.get(seen.parent_url, (version, 0))
                        misses[seen.parent_url] = (version, count + 1)
            versions.append(row)
            print(lie or "honest", json.dumps(row), flush=True)
    finally:
        for node in nodes.values():
            node.close()
        learner.stop()
    name_of = {url: name for name, url in url_of.items()}
    return {"misses": {name_of[url]: count for url, (_, count) in misses.items()}, "versions": versions}


def run_hand_written(name: str, settings: Settings) -> dict[str, Any]:
    """One version, one child whose parent is a hand-written liar (it relays nothing, so no plan): the
    child's lag, or that it was still fetching at HELD_CAP_S; closing the liar then lets the fetch end."""
    learner = ChunkServer(ChunkStore(), wait_s=settings.chunk_wait_s).start()
    child = Node("child", ChunkStore(trusted_key=PUBLIC_KEY), settings)
    manifest, chunks = new_version(1, settings)
    liar = HandWrittenParent(dribbled_head if name == "dribbled_head" else disowned_repair(manifest, chunks[0]))
    try:
        published_s = time.monotonic()
        learner.store.put_version(manifest, chunks, verified=True)
        fetching = child.fetch(manifest, [liar.url, learner.url])
        fetching.join(HELD_CAP_S)
        held = fetching.is_alive()
    finally:
        liar.close()  # its dribble ends: a fetch it held goes on (or fails) at once
        fetching.join(settings.version_timeout_s)
        child.close()
        learner.stop()
    row = {"child": outcome(child, published_s, "parent", {"parent": liar.url, "child": child.server.url})}
    if held:
        row["child"] = {"lag_s": None, "parent": "parent", "still_fetching_at_s": HELD_CAP_S}
    print(name, json.dumps(row), flush=True)
    return {"versions": [row]}


def outcome(node: Node, published_s: float, parent_id: str, url_of: dict[str, str]) -> dict[str, Any]:
    """One worker's version: its lag, its assigned parent, where the bytes came from, what failed."""
    name_of = {url: name for name, url in url_of.items()}
    if not isinstance(node.result, ArtifactFetch):
        return {"lag_s": None, "parent": parent_id, "error": str(node.result)}
    fetched = node.result
    return {
        "lag_s": round(node.done_s - published_s, 3),
        "parent": parent_id,
        "parent_share": round(fetched.parent_bytes / max(fetched.num_bytes, 1), 3),
        "bytes_by_source": {name_of.get(url, "learner"): num for url, num in fetched.bytes_by_source.items()},
        "failures": [
            f"{name_of.get(url, 'learner')}: {why}" for url, _, why in (f.partition(": ") for f in fetched.failures)
        ],
    }


def summarise_hand_written(scenario: dict[str, Any]) -> dict[str, Any]:
    child = scenario["versions"][0]["child"]
    return {"child_lag_s_first_version": child["lag_s"], "child_still_fetching_at_s": child.get("still_fetching_at_s")}


def summarise(scenario: dict[str, Any], honest: dict[str, Any] | None) -> dict[str, Any]:
    """The figures: first version's lags, means over versions, versions the parent under test had children,
    and (against the honest run) the lag the liar added over all versions."""
    rows = scenario["versions"]
    summary: dict[str, Any] = {
        "child_lag_s_first_version": lags(scenario, "child")[0],
        "grandchild_lag_s_first_version": lags(scenario, "grandchild")[0],
        "child_lag_s_mean": round(statistics.fmean(lags(scenario, "child")), 3),
        "grandchild_lag_s_mean": round(statistics.fmean(lags(scenario, "grandchild")), 3),
        "versions_parent_had_children": sum(
            any(row[name]["parent"] == "parent" for name in ("child", "grandchild")) for row in rows
        ),
        "misses_against_parent": scenario["misses"].get("parent", 0),
        "misses_against_child": scenario["misses"].get("child", 0),
    }
    if honest is not None:
        for name in ("child", "grandchild"):
            summary[f"{name}_extra_lag_s_total"] = round(sum(lags(scenario, name)) - sum(lags(honest, name)), 3)
    return summary


def lags(scenario: dict[str, Any], name: str) -> list[float]:
    """`name`'s lag per version (NaN for a version it failed to fetch)."""
    return [row[name]["lag_s"] if row[name]["lag_s"] is not None else float("nan") for row in scenario["versions"]]


def git_state() -> dict[str, str]:
    """The commit measured, and whether the weight channel (all this benchmark runs) differed from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False).stdout.strip()

    changed = git("status", "--porcelain", "--", "shared/weight_channel")
    return {"commit": git("rev-parse", "HEAD"), "weight_channel": "modified" if changed else "as committed"}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relay_liars", description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="after", help="the entry this run writes: before or after (the fix)")
    parser.add_argument("--versions", type=int, default=Settings.num_versions, help="versions per scenario")
    args = parser.parse_args()
    settings = Settings(num_versions=args.versions)
    scenarios = {"honest": run_scenario(None, settings)}
    for lie in ParentLie:
        scenarios[lie.value] = run_scenario(lie, settings)
    summary = {name: summarise(s, None if name == "honest" else scenarios["honest"]) for name, s in scenarios.items()}
    for name in HAND_WRITTEN:
        scenarios[name] = run_hand_written(name, settings)
        summary[name] = summarise_hand_written(scenarios[name])
    entry = {
        **git_state(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "summary": summary,
        "scenarios": scenarios,
    }
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    write_result(
        RESULTS,
        {
            "command": "python -m benchmarks.relay_liars --label before|after",
            "settings": dataclasses.asdict(settings),
            "window": (
                "from the learner's store holding the whole version to the worker's RelayFetcher returning with "
                "every chunk verified; outside: the manifest fetch, the plan lookup, the swap"
            ),
            "before": previous.get("before"),
            "after": previous.get("after"),
            args.label: entry,
        },
    )
    print(json.dumps(summary, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
