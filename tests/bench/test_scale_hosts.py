"""``kelp bench scale --hosts``: its delays are validated; the wire between hosts delays."""

from __future__ import annotations

import pytest

from kelp.bench.scale import _rtt_ms, _wire_subnet, parse_delays
from kelp.errors import UserError


def test_delays_parse_and_bad_ones_name_the_option() -> None:
    assert parse_delays("0,1,10") == [0.0, 1.0, 10.0]
    for bad in ("", "1,x", "-1", "5000"):
        with pytest.raises(UserError, match="--hosts"):
            parse_delays(bad)


@pytest.mark.integration
def test_the_wire_between_two_hosts_delays_each_way() -> None:
    from kelp.harness.delay_line import DelayLine
    from kelp.harness.hosts import HostRig, available

    ok, why = available()
    if not ok:
        pytest.skip(f"host rig unavailable here: {why}")
    with HostRig() as rig:
        a, b = rig.add_host("a"), rig.add_host("b")
        with DelayLine(a, b, _wire_subnet(rig.address), rig.prefix, delay_ms=5.0) as wire:
            # A frame is never carried before its due time: a round trip (a refused connect, answered
            # from the other host) takes at least twice the delay.
            assert _rtt_ms(a, wire.addresses[1]) >= 10.0
