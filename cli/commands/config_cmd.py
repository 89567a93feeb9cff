"""``kelp config validate FILE`` and ``kelp config show FILE``.

``validate`` also connects to the snapshot channel's Redis once and warns (exit
status stays 0) when its ``maxmemory-policy`` may evict the channel's keys
(:mod:`kelp.publish.channel_check`). It also imports ``trainer.model`` and runs
it once on a two-sample batch (:mod:`kelp.trainer.model_check`): a model that
does not import, build or fit the contract is one line and exit 2. With
``--for join`` it notes (exit status 0) when the join's waiting state shares the
embedding store's Redis because ``join.redis_url`` is unset. A join whose output
topic this config's source reads as JSON is refused by the config model itself
(:class:`~kelp.config.KelpConfig`), so ``validate`` refuses it for every role.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from kelp.config import effective_config, load_config

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="validate or show a config file")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    validate = verbs.add_parser(
        "validate",
        help="check a config file (with KELP_... env overrides) as `kelp train` (or `kelp serve`) would",
    )
    validate.add_argument("file")
    validate.add_argument(
        "--for",
        dest="role",
        choices=["train", "serve", "join"],
        default="train",
        help="the process it is for: train also checks the source (files, CSV columns); default train",
    )
    validate.set_defaults(handler=_validate)

    show = verbs.add_parser("show", help="print the effective config, secrets redacted")
    show.add_argument("file")
    show.add_argument("--format", choices=["yaml", "json"], default="yaml")
    show.set_defaults(handler=_show)


def _validate(args: argparse.Namespace) -> int:
    from kelp.daemon.preflight import preflight
    from kelp.publish.channel_check import check_channel_eviction

    cfg = load_config(args.file)
    preflight(cfg, args.file, role=args.role)
    # Imported here, once the file is valid: the model check needs torch, seconds to import, and a
    # file with a mistake is answered without it.
    from kelp.trainer.model_check import check_model

    model = check_model(cfg.features, cfg.trainer)
    tables = len(cfg.features.tables)
    print(
        f"{args.file}: ok (deployment={cfg.deployment}, source={cfg.source.kind}, store={cfg.store.backend}, "
        f"{len(cfg.features.dense)} dense, {len(cfg.features.sparse)} sparse features over {tables} tables)"
    )
    print(
        f"{args.file}: model {model.reference} ok ({model.parameters} dense parameters, "
        f"source {model.digest[:19]})"
    )
    # Advice, never a failure: a Redis that may evict the snapshot channel's keys (one connection).
    found = check_channel_eviction(cfg.publisher, cfg.store)
    if found is not None:
        print(f"{args.file}: {found}", file=sys.stderr)
    if args.role == "join":
        from kelp.join.process import shared_redis_note

        note = shared_redis_note(cfg)
        if note is not None:
            print(f"{args.file}: {note}", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    data = effective_config(load_config(args.file))
    if args.format == "json":
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0
