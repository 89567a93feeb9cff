"""Log lines an operator can act on: library noise lowered, no terminal colours in records, real addresses."""

from __future__ import annotations

import inspect
import io
import json
import logging
from collections.abc import Iterator

import kafka.cluster
import kafka.producer.kafka
import pytest
from prometheus_client import CollectorRegistry

from kelp.daemon.health import HealthServer
from kelp.logs import JsonLineFormatter, TextFormatter, configure_logging


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The CLI's JSON logging into a buffer; kafka-python's loggers put back as they were after."""
    levels = {name: logging.getLogger(name).level for name in ("kafka", "kafka.cluster")}
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    yield out
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_kafka_python_noise_is_lowered_and_its_other_errors_stay(json_log: io.StringIO) -> None:
    # The templates are kafka-python's own: a library upgrade that rewords them fails here.
    assert "Topic %s not found in cluster metadata" in inspect.getsource(kafka.cluster)
    assert "%s: Idempotence will be disabled" in inspect.getsource(kafka.producer.kafka)
    logging.getLogger("kafka.cluster").error("Topic %s not found in cluster metadata", "clicks")
    logging.getLogger("kafka.producer.kafka").warning(
        "%s: Idempotence will be disabled because user-provided config conflicts with idempotent "
        "defaults: %s",
        "<KafkaProducer>",
        "acks=1",
    )
    logging.getLogger("kafka.cluster").error("Topic %s is not authorized for this client", "clicks")
    got = _lines(json_log)
    assert [(d["level"], d["msg"]) for d in got] == [
        ("error", "Topic clicks is not authorized for this client")
    ]


def test_a_closing_clients_last_read_is_lowered_and_a_real_receive_error_stays(json_log: io.StringIO) -> None:
    import kafka.errors
    import kafka.net.transport

    assert "Error receiving network data" in inspect.getsource(kafka.net.transport)
    assert "Metadata refresh: failed %s" in inspect.getsource(kafka.cluster)
    transport = logging.getLogger("kafka.net.transport")
    template = "%s: Error receiving network data closing socket"
    for exc in (AttributeError("'NoneType' object has no attribute 'recv'"), ConnectionResetError("reset")):
        try:
            raise exc
        except Exception:
            transport.exception(template, "<KafkaTCPTransport [none] (closed)>")
    logging.getLogger("kafka.cluster").error("Metadata refresh: failed %s", kafka.errors.Cancelled())
    logging.getLogger("kafka.cluster").error("Metadata refresh: failed %s", TimeoutError("no answer"))
    got = [(d["level"], d["msg"]) for d in _lines(json_log)]
    assert got == [
        ("error", "<KafkaTCPTransport [none] (closed)>: Error receiving network data closing socket"),
        ("error", "Metadata refresh: failed no answer"),
    ]


def test_a_lowered_line_shows_at_its_new_level_where_that_level_is_on(json_log: io.StringIO) -> None:
    logging.getLogger("kafka").setLevel(logging.DEBUG)  # an operator debugging the client
    logging.getLogger("kafka.cluster").error("Topic %s not found in cluster metadata", "clicks")
    [line] = _lines(json_log)
    assert (line["level"], line["logger"]) == ("debug", "kafka.cluster")


def _uvicorn_record() -> logging.LogRecord:
    """What uvicorn logs at start: the message, and again with ANSI colours as ``color_message``."""
    return logging.makeLogRecord(
        {
            "name": "uvicorn.error",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "Uvicorn running on %s",
            "args": ("http://0.0.0.0:8080",),
            "color_message": "Uvicorn running on \x1b[1m%s\x1b[0m",
            "port": 8080,
        }
    )


def test_uvicorns_color_message_is_left_out_of_json_and_text_lines() -> None:
    doc = json.loads(JsonLineFormatter().format(_uvicorn_record()))
    assert doc["msg"] == "Uvicorn running on http://0.0.0.0:8080" and doc["port"] == 8080
    assert "color_message" not in doc
    text = TextFormatter().format(_uvicorn_record())
    assert "\x1b" not in text and "color_message" not in text and "port=8080" in text


def test_the_health_server_logs_the_address_it_is_bound_to(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kelp.health"):
        server = HealthServer("127.0.0.1", 0, CollectorRegistry(), lambda: (True, "ok"), lambda: (True, "ok"))
        server.start()
        server.stop()
    [line] = [r.getMessage() for r in caplog.records if "health and metrics on" in r.getMessage()]
    assert f"on 127.0.0.1:{server.port} " in line
