"""``kelp bench accuracy --quick``: both sides trained on the same stream, the sweep, the picture.

No threshold on any AUC here (figures are measured, not asserted); what must
hold is that Kelp and the reference trained the same samples, every figure the
contract names is there and finite, and the PNG was written.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kelp.bench import accuracy, run_suite
from kelp.bench.accuracy import default_data_dir
from kelp.errors import UserError

pytestmark = pytest.mark.integration

DATA = default_data_dir()
needs_data = pytest.mark.skipif(
    not (DATA / "movielens-100k").is_dir() or not (DATA / "criteo-attribution").is_dir(),
    reason=f"{DATA} does not hold the real streams",
)


SAMPLES = 8_000
"""Fewer samples than ``--quick``'s: what is asserted is the report's shape, not its figures."""


@needs_data
def test_quick_run_reports_parity_sweep_and_writes_the_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accuracy, "QUICK_SAMPLES", SAMPLES)
    result = run_suite("accuracy", quick=True, out_dir=tmp_path)
    for stream in ("criteo_attribution", "movielens"):
        assert result[f"{stream}_samples"] == SAMPLES
        for key in ("auc", "reference_auc", "log_loss", "reference_log_loss", "binned_auc"):
            value = result[f"{stream}_{key}"]
            assert math.isfinite(value) and value > 0.0, (stream, key, value)
        assert result[f"{stream}_auc_gap"] == pytest.approx(
            result[f"{stream}_auc"] - result[f"{stream}_reference_auc"], abs=2e-4
        )
    # the two-task run needs a conversion label; without one it says so and trains nothing
    skipped = result.get("criteo_attribution_multitask_skipped")
    if skipped is not None:
        assert "no conversion column" in skipped
        assert not any(k.startswith("criteo_attribution_multitask_click") for k in result)
    else:
        for task in ("click", "conversion"):
            for key in ("auc", "reference_auc", "auc_gap", "log_loss", "reference_log_loss"):
                value = result[f"criteo_attribution_multitask_{task}_{key}"]
                assert value is not None and math.isfinite(value), (task, key, value)
    # Taobao (engaged, buy) runs where the data folder has it (Kelp does not ship it)
    if (DATA / "taobao-userbehavior" / "UserBehavior.csv").is_file():
        assert result["taobao_multitask_samples"] == SAMPLES
        for task in ("engaged", "buy"):
            for key in ("auc", "reference_auc", "auc_gap", "log_loss", "reference_log_loss", "binned_auc"):
                value = result[f"taobao_multitask_{task}_{key}"]
                assert value is not None and math.isfinite(value), (task, key, value)
        assert (
            0.0
            < result["taobao_multitask_buy_positive_rate"]
            < result["taobao_multitask_engaged_positive_rate"]
        )
    else:
        assert "not found" in result["taobao_multitask_skipped"]
    sweep = {p["name"]: p for p in result["sweep"]}
    assert set(sweep) == {"min_count 1", "min_count 3", "min_count 3 + fallback", "TTL 7 d"}
    assert sweep["min_count 1"]["admission_counters"] == 0  # min_count 1 keeps no counters
    assert sweep["min_count 3"]["rows_stored"] < sweep["min_count 1"]["rows_stored"]
    assert sweep["min_count 3"]["admission_counters"] > 0
    # fallback buckets are rows too: stored and counted
    assert sweep["min_count 3 + fallback"]["rows_stored"] > sweep["min_count 3"]["rows_stored"]
    for point in sweep.values():
        assert point["bytes_stored"] > 0 and 0.0 < point["auc"] < 1.0
    assert Path(result["plot_path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_data_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="pass --data DIR"):
        run_suite("accuracy", quick=True, data_dir=tmp_path, out_dir=tmp_path)


def test_memory_auc_names_the_smallest_min_count_within_a_third_of_the_rows() -> None:
    from kelp.bench.accuracy_admission import memory_auc

    def entry(k: int, rows: int, cost: float, fallback: int = 0, form: str = "per_id") -> dict:
        return {
            "min_count": k,
            "fallback": fallback,
            "first_order": form,
            "rows_stored": rows,
            "auc_cost": cost,
            "reference_auc_cost": round(cost + 0.001, 4),
        }

    sweep = [
        entry(1, 1000, 0.0),
        entry(1, 1000, 0.0, form="projection"),
        entry(2, 400, 0.004),
        entry(2, 300, 0.009, fallback=64),  # fallback entries never answer
        entry(3, 300, 0.008),
        entry(3, 200, 0.010, form="projection"),
        entry(5, 100, 0.015),
    ]
    assert memory_auc(sweep) == {
        "min_count": 3,
        "rows_ratio": 0.3,
        "auc_cost": 0.008,
        "reference_auc_cost": 0.009,
    }
    assert memory_auc(sweep[:3])["min_count"] is None
