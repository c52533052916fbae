"""shared/metrics.py's HTTP server: a service's /metrics on a real port (port 0: no server)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.ports import free_port
from services.reward.prometheus import reward_families
from shared.metrics import CallbackCollector, start_metrics_server

pytestmark = pytest.mark.integration


def test_the_metrics_server_serves_on_the_port_and_port_0_is_off() -> None:
    assert start_metrics_server(0, CallbackCollector(lambda: reward_families(1, 2))) is None

    port = start_metrics_server(free_port(), CallbackCollector(lambda: reward_families(5, 9)))
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert families["relayrl_reward_scored_groups"][0].value == 5
