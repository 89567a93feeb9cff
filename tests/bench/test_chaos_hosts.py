"""``kelp bench chaos --hosts``: machines fail over under load and every invariant stays 0.

The end-to-end run starts a Redis Cluster (3 primaries + 3 replicas), a
3-node KRaft Kafka, ``kelp train`` and ``kelp serve`` on network-namespace
hosts and runs the quick schedule once (a minute or more): it needs root,
Java, and ``KELP_SLOW=1``, like the other slow chaos tests.
"""

from __future__ import annotations

import json
import os

import pytest

from kelp.bench import chaos_hosts
from kelp.bench.chaos import run
from kelp.bench.chaos_hosts import HOST_INVARIANTS, host_schedule
from kelp.errors import UserError


def test_hosts_takes_no_value_and_no_soak_or_broker_and_says_why_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(UserError, match="--hosts takes no value"):
        run(quick=True, hosts="0,1")
    with pytest.raises(UserError, match="drop --soak-minutes and --broker"):
        run(quick=True, hosts="", broker="tansu")
    monkeypatch.setattr(chaos_hosts, "available", lambda: (False, "network namespaces need root"))
    with pytest.raises(UserError, match="needs root and network namespaces: network namespaces need root"):
        run(quick=True, hosts="")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    not os.environ.get("KELP_SLOW"),
    reason="the host-mode chaos run, a minute or more; tests/store/test_failover.py and "
    "tests/daemon/test_kafka_failover.py cover each failover; KELP_SLOW=1",
)
def test_the_quick_host_mode_run_keeps_every_invariant_at_zero_and_every_fault_bites() -> None:
    from kelp.harness.hosts import available
    from kelp.harness.kafka_dist import java_available

    ok, why = available()
    if not ok:
        pytest.skip(f"host rig unavailable here: {why}")
    if not java_available():
        pytest.skip("Apache Kafka unavailable: java or mvn not found")
    result = run(quick=True, hosts="")
    shown = json.dumps({k: v for k, v in result.items() if k != "faults"}, indent=1, default=str)
    assert [f["fault"] for f in result["faults"]] == host_schedule(quick=True), shown
    assert {k: result[k] for k in HOST_INVARIANTS} == dict.fromkeys(HOST_INVARIANTS, 0), shown
    assert all(result["faults_observed"].values()), shown
    assert result["settled"] and result["records_committed"] == result["records_acked"] > 0, shown
    assert result["invariants_ok"], shown
