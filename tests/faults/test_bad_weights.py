"""A relay parent that lies about weights: it serves corrupt chunks, or a manifest signed by a key of its
own for weights of its own. Its relay children check every chunk against the learner's signed manifest
(fetched from the learner only), refuse what does not match, fetch it from another holder (the learner
last), and never load it; training goes on and every group is accounted for.

The lying worker is put first in the relay plan (the highest reported bandwidth: the learner's seed,
the other workers chained below it), so every other worker streams from it first."""

from __future__ import annotations

import re

import httpx
import pytest

from benchmarks.liars import FaultKind
from cluster.local import LocalCluster
from shared.api import StatusResponse, WorkerState
from shared.run_records import read_trust_records
from shared.signing import load_public_key
from shared.weight_channel import Manifest, ManifestError, verify_signature
from tests.faults.cluster_run import FaultRun, assert_nothing_lost
from tests.faults.conftest import FaultRunner

pytestmark = [pytest.mark.faults, pytest.mark.slow]

LIAR = "worker-0"
HONEST = ("worker-1", "worker-2")
FIRST_IN_THE_RELAY_PLAN = {LIAR: {"RL_WORKER_BANDWIDTH_MBPS": "100000"}}


def test_a_relay_parent_serving_corrupt_chunks(fault_run: FaultRunner) -> None:
    run = fault_run(liars={LIAR: FaultKind.CORRUPT_CHUNKS}, worker_env=FIRST_IN_THE_RELAY_PLAN)

    assert_nothing_lost(run)
    num_refused = assert_children_refused_and_kept_up(run)
    run.row["num_corrupt_chunks_refused"] = num_refused


def test_a_relay_parent_serving_a_forged_manifest(fault_run: FaultRunner) -> None:
    forged: list[Manifest] = []

    def fetch_the_liars_manifest(cluster: LocalCluster, status: StatusResponse) -> None:
        """What the liar's chunk server says the newest version is: a manifest the learner did not sign."""
        (liar,) = [worker for worker in status.workers if worker.name == LIAR]
        response = httpx.get(f"{liar.endpoint_url}/v1/weights/latest", timeout=10.0)
        assert response.status_code == 200, response.text
        forged.append(Manifest.from_json(response.content))
        with pytest.raises(ManifestError, match="signed by key"):
            verify_signature(forged[0], load_public_key(cluster.weights_keys.public_key_hex))

    run = fault_run(
        liars={LIAR: FaultKind.FORGED_MANIFEST},
        worker_env=FIRST_IN_THE_RELAY_PLAN,
        inject=fetch_the_liars_manifest,
        at_version=20,
    )

    assert forged and forged[0].signing_key_id != run.cluster.weights_keys.key_id
    assert_nothing_lost(run)
    num_refused = assert_children_refused_and_kept_up(run)
    run.row["num_forged_chunks_refused"] = num_refused
    # the refusals cost the honest workers nothing with the learner: no one is suspect, no one quarantined
    assert all(worker.state != WorkerState.QUARANTINED for worker in run.final_status.workers)
    threshold = run.cluster.run.trust.quarantine_score
    assert max(record.score for record in read_trust_records(run.run_dir / "trust.jsonl")) < threshold


def assert_children_refused_and_kept_up(run: FaultRun) -> int:
    """The liar's relay children refused the chunks it served and completed those versions from another
    holder (or gave the version up: never loaded); every honest worker kept generating. Returns the
    number of chunks refused."""
    (liar,) = run.workers_named(LIAR)
    refused = re.compile(rf"version (\d+)/(\w+) chunk \d+ from {re.escape(liar.endpoint_url)} is corrupt")
    num_refused = num_repaired = 0
    for name in HONEST:
        log = run.log(name)
        refused_artifacts = {(int(version), payload) for version, payload in refused.findall(log)}
        num_refused += len(refused.findall(log))
        for version, payload in refused_artifacts:
            # weights are loaded only once every chunk and the whole blob verified: a version the liar
            # served is completed from another holder ("... corrupt chunks refetched") or given up on
            fetched = re.search(rf"fetched version {version}/{payload}: .* (\d+) corrupt chunks refetched", log)
            assert fetched is not None or f"rejected weights version {version} " in log, (name, version, payload)
            num_repaired += fetched is not None
        (worker,) = run.workers_named(name)
        assert worker.num_groups_done > 0, worker
    assert num_refused > 0, "no worker streamed from the lying parent"
    assert num_repaired > 0, "no refused version was completed from another holder"
    return num_refused
