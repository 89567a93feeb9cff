"""``kelp model list | pin N | rollback | unpin --config F``: which published version replicas serve.

Replicas follow the snapshot channel's target: the pinned version while there
is a pin, else ``latest`` (the newest publish). These verbs move the pin for
every replica of the deployment at once, on either channel (Redis or a
directory). Replicas hear of it as of a publish (pub/sub, or the directory
check), and within ``serving.poll_interval_s`` at worst. Publishing goes on
meanwhile and moves ``latest``, which replicas do not follow until ``unpin``.

The history that can be pinned is what the channel keeps:
``publisher.keep_versions`` newest versions, plus the pinned one, which
pruning never deletes. A replica whose config says ``serving.model_version:
N`` ignores pins.

``list`` shows each version's step, age and the trainer's progressive AUC and
log loss over its last ``trainer.eval_window_batches`` batches at publish
(``-`` for a version published before manifests recorded them). ``rollback``
moves the dense weights and the model only: embedding rows keep their newest
state, since serving reads them from the store the trainer writes. It skips a
stored version that holds the same weights as the served one (recorded in
the manifests as ``dense_sha256``), so it never pins a no-op.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kelp.config import load_config
from kelp.errors import UserError
from kelp.publish.base import SnapshotChannel
from kelp.publish.errors import SnapshotMissingError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("model", help="list published versions; pin, roll back or unpin what serves")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    listing = verbs.add_parser("list", help="stored versions, with latest and the pin marked")
    listing.add_argument("--config", required=True)
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(handler=_list)

    pin = verbs.add_parser("pin", help="every replica serves this stored version until `unpin`")
    pin.add_argument("--config", required=True)
    pin.add_argument("version", type=int)
    pin.set_defaults(handler=_pin)

    rollback = verbs.add_parser(
        "rollback", help="pin the newest stored version below the one replicas serve now"
    )
    rollback.add_argument("--config", required=True)
    rollback.set_defaults(handler=_rollback)

    unpin = verbs.add_parser("unpin", help="lift the pin: replicas follow the newest publish again")
    unpin.add_argument("--config", required=True)
    unpin.set_defaults(handler=_unpin)


def _channel(path: str) -> SnapshotChannel:
    from kelp.publish.publisher import build_channel

    cfg = load_config(path)
    return build_channel(cfg.publisher, cfg.store, cfg.deployment)


def _describe(channel: SnapshotChannel) -> dict[str, Any]:
    latest, pin = channel.latest_version(), channel.pinned_version()
    rows = []
    for version in channel.versions():
        try:
            manifest = json.loads(channel.read_manifest_raw(version))
        except SnapshotMissingError:  # pruned since the listing
            continue
        except ValueError:
            manifest = {}
        quality = manifest.get("quality") or {}
        rows.append(
            {
                "version": version,
                "created_at": manifest.get("created_at"),
                "step": manifest.get("step"),
                "model": (manifest.get("model") or {}).get("reference"),
                "dense_sha256": manifest.get("dense_sha256"),
                "quality": quality or None,
                "latest": version == latest,
                "pinned": version == pin,
            }
        )
    return {"latest": latest, "pinned": pin, "serving": pin if pin is not None else latest, "versions": rows}


def _list(args: argparse.Namespace) -> int:
    with _channel(args.config) as channel:
        doc = _describe(channel)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    now = time.time()
    print(
        f"{'version':>8}  {'created (UTC)':<19}  {'age':>6}  {'step':>10}  {'auc':>6}  {'logloss':>7}  marks"
    )
    for row in doc["versions"]:
        created = row["created_at"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(created)) if created else "-"
        age = _age(now - created) if created else "-"
        marks = " ".join(m for m, on in (("latest", row["latest"]), ("pinned", row["pinned"])) if on)
        step = "-" if row["step"] is None else row["step"]
        quality = row["quality"] or {}
        auc, loss = _metric(quality.get("window_auc")), _metric(quality.get("window_log_loss"))
        print(f"{row['version']:>8}  {when:<19}  {age:>6}  {step:>10}  {auc:>6}  {loss:>7}  {marks}".rstrip())
    if doc["serving"] is None:
        print("nothing published")
        return 0
    state = f"pinned to v{doc['pinned']}" if doc["pinned"] is not None else "following latest"
    print(f"replicas serve v{doc['serving']} ({state})")
    return 0


def _age(seconds: float) -> str:
    """``42s``, ``17m``, ``5h``, ``3d``: how long ago a version was published, at a glance."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _metric(value: object) -> str:
    """A progressive metric to 4 places; ``-`` when the manifest has none (older, or undefined)."""
    return f"{value:.4f}" if isinstance(value, int | float) else "-"


def _set_pin(channel: SnapshotChannel, version: int) -> None:
    try:
        channel.set_pin(version)
    except SnapshotMissingError:
        stored = channel.versions()
        raise UserError(
            f"v{version} is not stored (stored: {', '.join(f'v{v}' for v in stored) or 'none'}); "
            "publisher.keep_versions sets how many are kept"
        ) from None


def _pin(args: argparse.Namespace) -> int:
    with _channel(args.config) as channel:
        before = channel.target().version
        _set_pin(channel, args.version)
        latest = channel.latest_version()
    print(
        f"pinned v{args.version} (replicas served v{before}; latest is v{latest}); "
        "`kelp model unpin` lifts it"
    )
    return 0


def _rollback(args: argparse.Namespace) -> int:
    with _channel(args.config) as channel:
        serving = channel.target().version
        if serving is None:
            raise UserError("nothing is published yet: there is no version to roll back from")
        older, same = _rollback_candidates(channel, serving)
        if not older:
            repeats = f" (v{', v'.join(map(str, same))} hold the same weights)" if same else ""
            raise UserError(
                f"no stored version below v{serving} with other weights to roll back to{repeats}; "
                "publisher.keep_versions says how many are kept"
            )
        _set_pin(channel, older[-1])
    skipped = f"; skipped v{', v'.join(map(str, same))}: same weights as v{serving}" if same else ""
    print(
        f"rolled back: pinned v{older[-1]} (replicas served v{serving}{skipped}); "
        "`kelp model unpin` lifts it; embedding rows keep their newest state"
    )
    return 0


def _weights_of(channel: SnapshotChannel, version: int) -> str | None:
    """A version's ``dense_sha256`` (its weights' digest); None when its manifest records none."""
    try:
        manifest = json.loads(channel.read_manifest_raw(version))
    except (SnapshotMissingError, ValueError):
        return None
    digest = manifest.get("dense_sha256") if isinstance(manifest, dict) else None
    return digest if isinstance(digest, str) else None


def _rollback_candidates(channel: SnapshotChannel, serving: int) -> tuple[list[int], list[int]]:
    """Stored versions below ``serving`` with other weights, and those with the same (skipped).

    Only versions whose manifests both record ``dense_sha256`` can be told equal;
    an older one without it is a candidate as before.
    """
    served = _weights_of(channel, serving)
    older: list[int] = []
    same: list[int] = []
    for version in (v for v in channel.versions() if v < serving):
        if served is not None and _weights_of(channel, version) == served:
            same.append(version)
        else:
            older.append(version)
    return older, same


def _unpin(args: argparse.Namespace) -> int:
    with _channel(args.config) as channel:
        pin = channel.pinned_version()
        channel.set_pin(None)
        latest = channel.latest_version()
    was = f"v{pin} was pinned" if pin is not None else "nothing was pinned"
    print(f"unpinned ({was}); replicas follow latest, v{latest}")
    return 0
