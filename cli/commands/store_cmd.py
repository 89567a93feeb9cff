"""``kelp store stats --config F``, ``kelp store inspect --config F TABLE ID...`` and
``kelp store acl --deployment D --role trainer|serving|join`` (the Redis ACL users, see
kelp.store.redis.acl)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from kelp.cli.commands import import_cmd, snapshot_cmd
from kelp.config import load_config
from kelp.errors import UserError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("store", help="look at the embedding store")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    stats = verbs.add_parser(
        "stats",
        help="this deployment's rows and admission counters per table, bytes, per-shard Redis info (JSON)",
    )
    stats.add_argument("--config", required=True)
    stats.set_defaults(handler=_stats)

    inspect = verbs.add_parser("inspect", help="print stored rows of some ids (never counts or admits)")
    inspect.add_argument("--config", required=True)
    inspect.add_argument("table")
    inspect.add_argument(
        "ids",
        nargs="+",
        help="ids as the events have them: digits below 2**64 are that id, any other text (m318, alice) "
        "is read by the one id rule as every source reads it",
    )
    inspect.set_defaults(handler=_inspect)

    acl = verbs.add_parser(
        "acl", help="print the ACL SETUSER line of a least-privilege Redis user (trainer, serving or join)"
    )
    acl.add_argument("--deployment", required=True, help="the config's deployment name")
    acl.add_argument("--role", required=True, choices=["trainer", "serving", "join"])
    acl.add_argument("--user", default=None, help="user name (default kelp-<deployment>-<role>)")
    acl.add_argument(
        "--password-file",
        default=None,
        help="file holding the password; the line carries only its SHA-256 (default: a placeholder)",
    )
    acl.set_defaults(handler=_acl)

    snapshot_cmd.add_verbs(verbs)
    import_cmd.add_verbs(verbs)


def _open(path: str):  # type: ignore[no-untyped-def]
    from kelp.store.factory import build_store

    cfg = load_config(path)
    store_cfg = cfg.store.model_copy(
        update={"hot_cache": cfg.store.hot_cache.model_copy(update={"enabled": False})}
    )
    return build_store(store_cfg, cfg.features.store_tables(), cfg.deployment)


def _stats(args: argparse.Namespace) -> int:
    from kelp.store.redis.shared import RedisStoreBase

    cfg = load_config(args.config)
    if cfg.store.backend == "memory":
        raise UserError(
            f"{args.config}: store.backend is memory: its rows live inside the `kelp train` process, which "
            "this command cannot see; read that process's /metrics (kelp_store_*) or use a Redis backend"
        )
    with _open(args.config) as store:
        doc = dataclasses.asdict(store.stats())
        if isinstance(store, RedisStoreBase):  # this deployment's keys, not the whole database's
            counts = store.count_keys()
            doc["rows"] = {table: c["rows"] for table, c in counts.items()}
            doc["admission_counters"] = {table: c["counters"] for table, c in counts.items()}
        print(json.dumps(doc, indent=2, default=str))
    return 0


def _acl(args: argparse.Namespace) -> int:
    from kelp.config.root import KelpConfig
    from kelp.store.redis.acl import setuser_line

    try:  # the same rule as the config's deployment field, so the patterns match its keys
        KelpConfig._deployment(args.deployment)
    except ValueError as exc:
        raise UserError(f"--deployment {args.deployment!r}: {exc}") from None
    password = None
    if args.password_file is not None:
        try:
            password = Path(args.password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise UserError(f"--password-file: cannot read {args.password_file}: {exc.strerror}") from None
        if not password:
            raise UserError(f"--password-file: {args.password_file} is empty")
    print(setuser_line(args.deployment, args.role, args.user, password))
    return 0


def _row_ids(given: list[str]) -> np.ndarray:
    """The stored id of each id as typed, by the one id rule the sources and serving apply
    (:func:`kelp.consumers.ids.str_id`), so a user never hashes an id to look up its row."""
    from kelp.consumers.ids import str_id

    out = np.empty(len(given), dtype=np.uint64)
    for k, text in enumerate(given):
        try:
            out[k] = str_id(text)
        except ValueError:  # text with no UTF-8 bytes (an undecodable argument): nothing to hash
            raise UserError(f"id {text!r} is not valid text; it has no id") from None
    return out


def _inspect(args: argparse.Namespace) -> int:
    ids = _row_ids(args.ids)
    with _open(args.config) as store:
        got = store.pull(args.table, ids, count=False)
        meta = None
        if hasattr(store, "raw_values"):
            decoded = store.table(args.table).codec.decode(store.raw_values(args.table, ids))
            meta = decoded
        for i, row_id in enumerate(ids.tolist()):
            entry = {
                "id": row_id,
                "given": args.ids[i],
                "stored": bool(got.admitted[i]),
                "state": float(got.state[i]),
                "row": [round(float(x), 6) for x in got.rows[i]],
            }
            if meta is not None and meta.present[i]:
                entry["updated_s"] = int(meta.updated_s[i])
            print(json.dumps(entry))
    return 0
