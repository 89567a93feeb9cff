"""``kelp produce``: replay a file or criteo-synth into a Kafka topic (schema-v1 messages)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kelp.errors import UserError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "produce",
        help="replay a file or criteo-synth into a Kafka topic",
        description="Replay a file or criteo-synth into a Kafka topic. A progress bar is drawn on stderr "
        "when it is a terminal and --log-format is text; otherwise a log line every 10 s.",
    )
    p.add_argument(
        "--config",
        help="config file: a kafka source gives bootstrap, first topic and security; a file source gives "
        "the file to replay (and its csv mapping)",
    )
    p.add_argument("--bootstrap", help="host:port[,host:port] (overrides the config)")
    p.add_argument("--topic", help="topic (overrides the config's first topic)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--file", type=Path, help="file to replay")
    src.add_argument("--synth", choices=["criteo"], help="generate criteo-synth instead of reading a file")
    p.add_argument("--format", choices=["criteo_tsv", "csv", "msgpack"], default="criteo_tsv")
    p.add_argument("--samples", type=int, default=100_000, help="samples to generate with --synth")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=None, help="samples/s (default: as fast as possible)")
    p.add_argument(
        "--batch-size", type=int, default=256, help="samples per message; 1 = single-sample messages"
    )
    p.add_argument(
        "--startup-timeout-s",
        type=float,
        default=10.0,
        help="how long to wait for the bootstrap servers to answer before failing (default 10; "
        "kafka-python alone waits 30)",
    )
    p.set_defaults(handler=_produce)


def _produce(args: argparse.Namespace) -> int:
    from kelp.bench.synth import synth_messages
    from kelp.config import FileSourceConfig, KafkaSourceConfig, load_config
    from kelp.consumers.kafka_client import client_settings
    from kelp.consumers.produce import file_messages, produce

    cfg = load_config(args.config) if args.config else None
    kafka = cfg.source if cfg is not None and isinstance(cfg.source, KafkaSourceConfig) else None
    file_cfg = cfg.source if cfg is not None and isinstance(cfg.source, FileSourceConfig) else None
    producer_cfg = client_settings(kafka) if kafka is not None else {}
    if args.bootstrap:
        producer_cfg["bootstrap_servers"] = args.bootstrap.split(",")
    if "bootstrap_servers" not in producer_cfg:
        raise UserError("no Kafka bootstrap servers: pass --bootstrap or a --config with a kafka source")
    if args.startup_timeout_s <= 0:
        raise UserError("--startup-timeout-s must be > 0")
    producer_cfg["bootstrap_timeout_ms"] = int(args.startup_timeout_s * 1000)
    topic = args.topic or (kafka.topics[0] if kafka is not None else None)
    if not topic:
        raise UserError("no topic: pass --topic or a --config with a kafka source (source.topics)")
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    total = None  # a file's sample count is not known before it is read: the bar counts up
    if args.synth:
        messages = synth_messages(args.samples, args.batch_size, args.seed)
        total = args.samples
    elif args.file or file_cfg is not None:
        path = args.file or file_cfg.path  # type: ignore[union-attr]
        fmt = args.format if args.file else file_cfg.format  # type: ignore[union-attr]
        if not Path(path).exists():
            raise UserError(f"{path}: no such file")
        label = cfg.features.label.name if cfg is not None else "label"
        messages = file_messages(Path(path), fmt, args.batch_size, file_cfg, label)
    else:
        raise UserError("nothing to produce: pass --file, --synth criteo, or a --config with a file source")
    connecting = (
        f"bootstrap {','.join(producer_cfg['bootstrap_servers'])} within {args.startup_timeout_s:g}s "
        "(--startup-timeout-s)"
    )
    summary = produce(producer_cfg, topic, messages, rate=args.rate, total=total, connecting=connecting)
    print(
        json.dumps(
            {
                "records": summary.records,
                "messages": summary.messages,
                "bytes": summary.bytes,
                "seconds": round(summary.seconds, 3),
                "rate": round(summary.rate, 1),
                "topic": topic,
            }
        )
    )
    return 0
