"""``kelp dashboard preview``: the dashboard's panels evaluated by promtool over real scrapes, drawn.

``data/dashboard-scrapes.jsonl.gz`` is a real recording: the last 12 s of a
``kelp dashboard preview --seconds 30 --save-scrapes`` run (trainer and
serving replica scraped every second), trimmed with
:func:`kelp.plots.scrape.trim` to the series the overview stats and the key
panels read. The fast tests evaluate it with promtool; the end-to-end test
(``KELP_SLOW=1``) records a fresh one from a running deployment.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from chartkit import DASHBOARD, ROOT

from kelp.cli.main import main
from kelp.errors import UserError
from kelp.plots.dashboard import KEY_PANELS, grafana_to_promql, key_panels, load_dashboard, metric_names
from kelp.plots.dashboard_preview import Preview, preview
from kelp.plots.promql_eval import Grid, _parse_vector, evaluate, parse_failures
from kelp.plots.scrape import Scrape, load_scrapes, samples, scrape_interval, trim

RECORDING = Path(__file__).parent / "data" / "dashboard-scrapes.jsonl.gz"
SYNTH = ROOT / "examples" / "criteo-synth.yaml"  # a config whose source the preview cannot replay
STEP_S = 1.0


@pytest.fixture(scope="module")
def scrapes() -> list[Scrape]:
    return load_scrapes(RECORDING)


@pytest.fixture(scope="module")
def evaluated(promtool: str, scrapes: list[Scrape]) -> Preview:
    return preview(scrapes, STEP_S, DASHBOARD, promtool)


def _lines(result: Preview, title: str) -> dict[str, list[float]]:
    (data,) = [d for d in result.panels if d.panel.title == title]
    return {line.label: line.values for line in data.lines}


def test_every_overview_stat_and_key_panel_has_data(evaluated: Preview) -> None:
    assert [d.panel.title for d in evaluated.panels] == [t for t in evaluated_order() if t in KEY_PANELS]
    assert len(evaluated.stats) == 6
    empty = [d.panel.title for d in [*evaluated.stats, *evaluated.panels] if not d.has_data]
    assert empty == []


def evaluated_order() -> list[str]:
    return [p.title for p in load_dashboard(DASHBOARD)]


def test_key_panels_show_the_series_a_person_looks_for(evaluated: Preview) -> None:
    latency = _lines(evaluated, "Store operation latency p99")
    assert {"pull", "push"} <= set(latency)
    throughput = _lines(evaluated, "Throughput")
    assert max(throughput["trained samples/s"]) > 0
    assert {"rejected: bad_msgpack", "rejected: bad_version", "rejected: bad_dense"} <= set(throughput)
    assert max(_lines(evaluated, "Kafka commits and dead letters")["dead letters ok"]) > 0
    readiness = _lines(evaluated, "Serving load")
    assert readiness["ready replicas"][-1] == 1
    assert readiness["ready trainers"][-1] == 1
    requests = _lines(evaluated, "Requests by endpoint and status")
    assert max(requests["/v1/score 200"]) > 0
    assert max(requests["/v1/score 422"]) > 0  # the client's malformed requests
    # Only scoring endpoints in the latency and error panels (probes and scrapes are not requests).
    assert all(
        "/v1/score" in label or label == "p99 store fetch" for label in _lines(evaluated, "Serving latency")
    )
    errors = _lines(evaluated, "Serving errors")
    assert errors["5xx /v1/score"] and all(v == 0 for v in errors["5xx /v1/score"])
    staleness = _lines(evaluated, "Hot tier staleness (oldest update not yet in Redis)")
    assert staleness["configured bound"][-1] > 0


def test_promtool_values_are_the_scraped_values_on_the_grid(promtool: str, scrapes: list[Scrape]) -> None:
    """A gauge read back at each step is the value scraped nearest that step (same target labels)."""
    grid = Grid.of(scrapes, STEP_S)
    name = "kelp_store_hot_cache_dirty_age_seconds"
    expr = f'{name}{{job="kelp-trainer"}}'
    (series,) = evaluate([expr], scrapes, grid, promtool)[expr]
    assert series.labels["job"] == "kelp-trainer"
    assert series.labels["instance"] == "trainer-0"
    scraped = {
        grid.index(s.at): x.value
        for s in scrapes
        if s.job == "kelp-trainer"
        for x in samples(s)
        if x.name == name
    }
    got = dict(zip((grid.index(t) for t in series.times), series.values, strict=True))
    assert got == {i: scraped[max(j for j in scraped if j <= i)] for i in got}
    assert set(scraped) <= set(got)


def test_time_is_moved_to_the_scraped_clock(promtool: str, scrapes: list[Scrape]) -> None:
    """``time() - <a timestamp gauge>`` is a small age, not 55 years: promtool's clock starts at 0."""
    grid = Grid.of(scrapes, STEP_S)
    expr = grafana_to_promql(
        "time() - max(kelp_publisher_last_publish_timestamp_seconds)", STEP_S, grid.start_s
    )
    (series,) = evaluate([expr], scrapes, grid, promtool)[expr]
    assert all(0 <= v < 60 for v in series.values)


def test_time_since_last_publish_is_empty_before_the_first_publish(promtool: str) -> None:
    """The publisher's timestamp gauge is 0 until it publishes; the panel must not read 56 years."""
    (model_age,) = [p for p in load_dashboard(DASHBOARD) if p.title == "Model age"]
    (target,) = [t for t in model_age.targets if t.legend == "since last publish"]
    start = 1_795_000_000.0
    scrapes = [
        Scrape(
            "kelp-trainer", "trainer-0", start + i, f"kelp_publisher_last_publish_timestamp_seconds {stamp}\n"
        )
        for i, stamp in enumerate([0.0, 0.0, 0.0, start + 2.5, start + 2.5, start + 2.5])
    ]
    grid = Grid.of(scrapes, STEP_S)
    expr = grafana_to_promql(target.expr, STEP_S, grid.start_s)
    (series,) = evaluate([expr], scrapes, grid, promtool)[expr]
    assert [grid.index(t) for t in series.times] == [3, 4, 5]
    assert series.values == pytest.approx([0.5, 1.5, 2.5])


def test_grafana_variables_become_promql() -> None:
    expr = 'rate(kelp_x_total{namespace=~"$namespace"}[$__rate_interval]) and time() > 0'
    assert grafana_to_promql(expr, 1.0, 1000.0) == (
        'rate(kelp_x_total{namespace=~".*"}[4000ms]) and (time() + 1000.000) > 0'
    )
    with pytest.raises(UserError, match="unknown Grafana variable"):
        grafana_to_promql("kelp_x{a=~'$other'}", 1.0, 0.0)


def test_promtool_report_is_parsed_with_awkward_labels() -> None:
    report = "\n".join(
        [
            "  FAILED:",
            '    expr: "sum by (reason) (x{a=\\"b\\"})", time: 1m2.5s,',
            "        exp: nil",
            '        got: {reason="a, {b}=c", q="say \\"hi\\""} 1.5E+00, {} NaN, {le="+Inf"} +Inf',
            '    expr: "y", time: 0s,',
            "        exp: nil",
            "        got: {} -2E-03",
        ]
    )
    parsed = parse_failures(report)
    assert set(parsed) == {('sum by (reason) (x{a="b"})', 62_500), ("y", 0)}
    first, nan, inf = parsed[('sum by (reason) (x{a="b"})', 62_500)]
    assert first == ({"reason": "a, {b}=c", "q": 'say "hi"'}, 1.5)
    assert nan[0] == {} and math.isnan(nan[1])
    assert inf == ({"le": "+Inf"}, math.inf)
    assert parsed[("y", 0)] == [({}, -0.002)]
    assert _parse_vector("nil") == []


def test_promtool_parse_error_is_reported(promtool: str, scrapes: list[Scrape]) -> None:
    from kelp.errors import KelpError

    grid = Grid.of(scrapes, STEP_S)
    with pytest.raises(KelpError, match="unclosed left parenthesis"):
        evaluate(["sum(rate(kelp_trainer_samples_total[4s])"], scrapes, grid, promtool)


def test_a_recording_knows_its_scrape_interval(scrapes: list[Scrape]) -> None:
    assert scrape_interval(scrapes) == STEP_S
    with pytest.raises(UserError, match="at least two scrapes"):
        scrape_interval(scrapes[:1])


def test_trim_keeps_only_the_named_series(scrapes: list[Scrape]) -> None:
    kept = trim(scrapes[0], {"kelp_trainer_ready"})
    assert {s.name for s in samples(kept)} <= {"kelp_trainer_ready"}


def test_key_panel_names_are_dashboard_titles() -> None:
    panels = load_dashboard(DASHBOARD)
    assert [p.title for p in key_panels(panels)] == [p.title for p in panels if p.title in KEY_PANELS]
    assert len(KEY_PANELS) >= 8
    for panel in key_panels(panels):
        assert all(metric_names(t.expr) for t in panel.targets), panel.title


def test_cli_draws_a_png_from_a_recording(
    promtool: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "preview.png"
    code = main(["dashboard", "preview", "--from-scrapes", str(RECORDING), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(out).shape
    assert width > 1500 and height > 1000
    assert "NO DATA" not in printed
    assert all(f"ok      {title}" in printed for title in KEY_PANELS)


def test_cli_exits_1_naming_a_panel_whose_query_matches_nothing(
    promtool: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in doc["panels"]:
        if panel.get("title") == "Consumer lag by topic":
            panel["targets"][0]["expr"] = "sum by (topic) (kelp_consumer_lag_recrods)"
    broken = tmp_path / "dashboard.json"
    broken.write_text(json.dumps(doc))
    args = ["dashboard", "preview", "--from-scrapes", str(RECORDING), "--dashboard", str(broken)]
    code = main([*args, "--out", str(tmp_path / "p.png")])
    captured = capsys.readouterr()
    assert code == 1
    assert "NO DATA Consumer lag by topic" in captured.out
    assert captured.err.strip() == "kelp: error: 1 panel(s) show no data: Consumer lag by topic"
    assert (tmp_path / "p.png").is_file()  # drawn anyway: the picture shows which panel is empty


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seconds", "1"], "--seconds 1: choose 5 to 600"),
        (["--interval", "20"], "--interval 20: choose 0.1 s to a third of --seconds"),
        (["--out", "x.svg"], "--out x.svg: the preview is a .png"),
        (
            ["--seconds", "300", "--interval", "0.2"],
            "--seconds 300 / --interval 0.2: at most 600 scrapes a target",
        ),
        (
            ["--config", str(SYNTH)],
            f"{SYNTH}: the preview replays a criteo_tsv file source (like kelp demo)",
        ),
        (["--from-scrapes", "/nonexistent.jsonl"], "no scrape recording at /nonexistent.jsonl"),
    ],
)
def test_cli_operator_mistakes_are_one_line(
    promtool: str, args: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["dashboard", "preview", *args]) == 2
    assert capsys.readouterr().err == f"kelp: error: {message}\n"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("KELP_SLOW"), reason="a 20 s deployment; set KELP_SLOW=1")
def test_a_live_deployment_fills_every_key_panel(promtool: str, tmp_path: Path) -> None:
    from kelp.demo.dashboard_run import record_deployment
    from kelp.demo.run import default_config_path

    recording = record_deployment(default_config_path(), seconds=20, interval_s=1.0, out=lambda _: None)
    assert recording.scrape_failures == 0
    assert {(s.job, s.instance) for s in recording.scrapes} == {
        ("kelp-trainer", "trainer-0"),
        ("kelp-serving", "serving-0"),
    }
    result = preview(recording.scrapes, recording.interval_s, DASHBOARD, promtool)
    assert [d.panel.title for d in result.panels if not d.has_data] == []
