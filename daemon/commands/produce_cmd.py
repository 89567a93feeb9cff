"""``kelp produce``: replay a file or criteo-synth into a Kafka topic (schema-v1 messages)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kelp.errors import UserError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("produce", help="replay a file or criteo-synth into a Kafka topic")
    p.add_argument(
        "--config", help="config file: kafka section (bootstrap, first topic, security) and source.file"
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
    p.set_defaults(handler=_produce)


def _produce(args: argparse.Namespace) -> int:
    from kelp.config import load_config
    from kelp.consumers.kafka_source import client_settings
    from kelp.consumers.produce import file_messages, produce, synth_messages

    cfg = load_config(args.config) if args.config else None
    producer_cfg = client_settings(cfg.kafka) if cfg is not None and cfg.kafka is not None else {}
    if args.bootstrap:
        producer_cfg["bootstrap_servers"] = args.bootstrap.split(",")
    if "bootstrap_servers" not in producer_cfg:
        raise UserError("no Kafka bootstrap servers: pass --bootstrap or a --config with a kafka section")
    topic = args.topic or (cfg.kafka.topics[0] if cfg is not None and cfg.kafka is not None else None)
    if not topic:
        raise UserError("no topic: pass --topic or a --config with kafka.topics")
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    if args.synth:
        messages = synth_messages(args.samples, args.batch_size, args.seed)
    elif args.file or (cfg is not None and cfg.source.file is not None):
        file_cfg = cfg.source.file if cfg is not None else None
        path = args.file or file_cfg.path  # type: ignore[union-attr]
        fmt = args.format if args.file else file_cfg.format  # type: ignore[union-attr]
        if not Path(path).exists():
            raise UserError(f"{path}: no such file")
        messages = file_messages(Path(path), fmt, args.batch_size, file_cfg)
    else:
        raise UserError("nothing to produce: pass --file, --synth criteo, or a --config with source.file")
    summary = produce(producer_cfg, topic, messages, rate=args.rate)
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
