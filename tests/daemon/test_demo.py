"""`kelp demo` runs end to end against the real services."""

from __future__ import annotations

from pathlib import Path

import pytest
from kelp.daemon.demo import default_config_path, run_demo

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "criteo-kaggle-8k" / "train.tsv"


@pytest.mark.skipif(not SAMPLE.exists(), reason="needs ../shared/data beside the checkout")
def test_demo_profiles_sample_and_round_trips_services() -> None:
    lines: list[str] = []
    report = run_demo(default_config_path(), out=lines.append, service_records=300)
    assert report.samples == 7200
    assert 0.1 < report.positive_rate < 0.4
    assert report.tables == 26
    assert report.distinct_ids > 1000
    assert 0 < report.singleton_share < 1
    assert report.services_ran
    assert any("300 records produced and 300 consumed" in line for line in lines)
