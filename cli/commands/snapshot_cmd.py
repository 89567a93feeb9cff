"""``kelp store snapshot | snapshots | restore``: point-in-time copies of a deployment's rows.

* ``snapshot --config F [--incremental] [--to URL]`` takes one (rows, the
  group's committed offsets, the newest published dense version) while
  training goes on, then deletes what ``snapshots.rows.keep`` no longer keeps;
  it prints one JSON line.
* ``snapshots --config F [--from URL] [--json]`` lists them, oldest first;
  snapshots without a manifest (being written, or killed) are marked incomplete.
* ``restore --config F --snapshot ID|latest [--replace] [--keep-offsets]
  [--from URL] [--checkpoint-dir DIR]`` rebuilds the rows and puts the
  consumer group back at the snapshot's offsets (stop the trainers first).

What the rows are consistent with is in :mod:`kelp.daemon.row_snapshots`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kelp.cli.commands.model_cmd import age_text
from kelp.config import load_config

__all__ = ["add_verbs"]


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """Adds this module's verbs to ``kelp store``."""
    snap = verbs.add_parser(
        "snapshot", help="write every row, the group's offsets and the dense version to snapshot storage"
    )
    snap.add_argument("--config", required=True)
    snap.add_argument(
        "--incremental", action="store_true", help="only rows updated since the newest snapshot (its child)"
    )
    snap.add_argument("--to", default=None, metavar="URL", help="storage instead of snapshots.rows.url")
    snap.add_argument(
        "--shard-rows",
        type=_positive,
        default=None,
        metavar="N",
        help="rows per shard object (default 262144); memory holds about one shard per Redis shard",
    )
    snap.set_defaults(handler=_snapshot)

    listing = verbs.add_parser("snapshots", help="list this deployment's row snapshots, oldest first")
    listing.add_argument("--config", required=True)
    listing.add_argument(
        "--from", dest="url", default=None, metavar="URL", help="instead of snapshots.rows.url"
    )
    listing.add_argument("--to", dest="url", default=None, help=argparse.SUPPRESS)
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(handler=_snapshots)

    restore = verbs.add_parser(
        "restore", help="rebuild the rows from a snapshot and set the consumer group's offsets back to it"
    )
    restore.add_argument("--config", required=True)
    restore.add_argument("--snapshot", required=True, metavar="ID", help="a snapshot id, or latest")
    restore.add_argument(
        "--replace", action="store_true", help="drop the rows the store holds now (else it must be empty)"
    )
    restore.add_argument(
        "--keep-offsets", action="store_true", help="leave the consumer group's committed offsets alone"
    )
    restore.add_argument(
        "--from", dest="url", default=None, metavar="URL", help="instead of snapshots.rows.url"
    )
    restore.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="install the snapshot's trainer checkpoint here (default: trainer.checkpoint_dir if it exists)",
    )
    restore.set_defaults(handler=_restore)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _snapshot(args: argparse.Namespace) -> int:
    from kelp.daemon.row_snapshots import open_snapshot_storage, prune_snapshots, take_snapshot

    cfg = load_config(args.config)
    started = time.monotonic()
    sizing = {} if args.shard_rows is None else {"shard_rows": args.shard_rows}
    manifest = take_snapshot(cfg, incremental=args.incremental, storage_url=args.to, **sizing)
    pruned = prune_snapshots(cfg, open_snapshot_storage(cfg, args.to))
    doc = {
        "id": manifest.snapshot_id,
        "kind": manifest.kind,
        "parent": manifest.parent,
        "rows": manifest.total_rows,
        "bytes": manifest.total_bytes,
        "shards": len(manifest.shards),
        "dense_version": None if manifest.dense is None else manifest.dense.get("version"),
        "offsets": len(manifest.offsets),
        "seconds": round(time.monotonic() - started, 3),
        "pruned": pruned,
    }
    print(json.dumps(doc))
    return 0


def _entries(cfg: Any, url: str | None) -> list[dict[str, Any]]:
    from kelp.daemon.row_snapshots import open_snapshot_storage
    from kelp.store.snapshots.catalog import incomplete_snapshots, list_snapshots

    storage = open_snapshot_storage(cfg, url)
    rows = [
        {
            "id": m.snapshot_id,
            "complete": True,
            "kind": m.kind,
            "parent": m.parent,
            "created_at": m.created_at,
            "rows": m.total_rows,
            "bytes": m.total_bytes,
            "dense_version": None if m.dense is None else m.dense.get("version"),
            "group_id": m.group_id,
            "offsets": m.offsets,
            "checkpoint": m.checkpoint is not None,
        }
        for m in list_snapshots(storage, cfg.deployment)
    ]
    rows += [{"id": s, "complete": False} for s in incomplete_snapshots(storage, cfg.deployment)]
    return sorted(rows, key=lambda r: r["id"])


def _offsets_summary(offsets: list[dict[str, Any]]) -> str:
    """``events:2p=1234``: per topic, partitions and the sum of their next offsets."""
    if not offsets:
        return "-"
    per: dict[str, list[int]] = {}
    for o in offsets:
        per.setdefault(o["topic"], []).append(int(o["offset"]))
    return " ".join(f"{t}:{len(v)}p={sum(v)}" for t, v in sorted(per.items()))


def _snapshots(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    entries = _entries(cfg, args.url)
    if args.json:
        print(json.dumps({"deployment": cfg.deployment, "snapshots": entries}, indent=2))
        return 0
    now = time.time()
    print(
        f"{'id':<30}  {'kind':<11}  {'parent':<30}  {'rows':>10}  {'bytes':>12}  {'age':>5}  "
        f"{'dense':>5}  offsets"
    )
    for e in entries:
        if not e["complete"]:
            print(f"{e['id']:<30}  {'incomplete':<11}  (no manifest: being written, or killed)")
            continue
        dense = "-" if e["dense_version"] is None else f"v{e['dense_version']}"
        print(
            f"{e['id']:<30}  {e['kind']:<11}  {e['parent'] or '-':<30}  {e['rows']:>10}  {e['bytes']:>12}  "
            f"{age_text(now - e['created_at']):>5}  {dense:>5}  {_offsets_summary(e['offsets'])}"
        )
    if not entries:
        print(f"no snapshots of deployment {cfg.deployment!r}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    from kelp.daemon.row_snapshots import restore_snapshot

    cfg = load_config(args.config)
    report = restore_snapshot(
        cfg,
        args.snapshot,
        replace=args.replace,
        set_offsets=not args.keep_offsets,
        storage_url=args.url,
        checkpoint_dir=args.checkpoint_dir,
    )
    print(json.dumps(report.to_json()))
    return 0
