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

``rollback --rows [--snapshot ID] [--from URL]`` moves rows and dense weights
back together, from a row snapshot (:mod:`kelp.daemon.row_snapshots`): the
given one, else the newest whole snapshot whose dense version is below the
served one (one taken while the bad version served holds rows the bad data
trained). With the trainers stopped (refused while their consumer group has
members), it restores the rows (replacing the store's), the group's offsets
and the trainer checkpoint, then pins the snapshot's dense version, published
again from the snapshot's copy when the channel has pruned it. Replicas read
rows from the store, so they serve the restored rows at once (after
``serving.local_cache_ttl_ms`` with a row cache), and the pin as any pin.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from kelp.config import load_config
from kelp.errors import UserError
from kelp.publish.errors import SnapshotMissingError

if TYPE_CHECKING:  # the channel drags in torch; every ``kelp`` command registers this one at start
    from kelp.publish.base import SnapshotChannel

__all__ = ["age_text", "register"]


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
        "rollback",
        help="pin the newest stored version below the one replicas serve now; "
        "--rows: move the rows back with it, from a row snapshot",
    )
    rollback.add_argument("--config", required=True)
    rollback.add_argument(
        "--rows",
        action="store_true",
        help="restore the rows of a row snapshot (replacing the store's), set the trainers' offsets and "
        "checkpoint to it, and serve its dense weights; stop every trainer first",
    )
    rollback.add_argument(
        "--snapshot",
        default=None,
        help="with --rows: the row snapshot (default: the newest with a dense version below the served one)",
    )
    rollback.add_argument(
        "--from",
        dest="from_url",
        default=None,
        help="with --rows: where the snapshots are (default snapshots.rows.url)",
    )
    rollback.set_defaults(handler=_rollback)

    unpin = verbs.add_parser("unpin", help="lift the pin: replicas follow the newest publish again")
    unpin.add_argument("--config", required=True)
    unpin.set_defaults(handler=_unpin)


def _channel(path: str) -> SnapshotChannel:
    cfg = load_config(path)  # before the channel's imports (torch, seconds): a mistake is answered at once
    from kelp.publish.publisher import build_channel

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
        age = age_text(now - created) if created else "-"
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


def age_text(seconds: float) -> str:
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
    if args.rows:
        return _rollback_rows(args)
    if args.snapshot is not None or args.from_url is not None:
        raise UserError("--snapshot and --from choose a row snapshot: they go with --rows")
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


# --------------------------------------------------------------------------- rollback --rows


def _rollback_rows(args: argparse.Namespace) -> int:
    """Rows, offsets, trainer checkpoint and served dense weights back to one row snapshot.

    The order keeps a failure harmless: the snapshot is chosen and the trainers
    checked first (nothing changed), then the restore, and the pin last, so
    replicas never serve the snapshot's dense weights over rows not restored.
    """
    from kelp.daemon.row_snapshots import open_snapshot_storage, restore_snapshot

    cfg = load_config(args.config)
    storage = open_snapshot_storage(cfg, args.from_url)
    with _channel(args.config) as channel:
        serving = channel.target().version
        manifest = _chosen_snapshot(storage, cfg.deployment, args.snapshot, serving)
        _refuse_running_trainers(cfg)
        report = restore_snapshot(
            cfg, manifest.snapshot_id, replace=True, set_offsets=True, storage_url=args.from_url
        )
        dense = _serve_snapshot_dense(cfg, channel, storage, manifest)
    lines = [
        f"rolled back to row snapshot {manifest.snapshot_id}: {sum(report.rows.values())} rows restored "
        "(replacing the store's)"
    ]
    if report.offsets:
        lines.append(
            f"the trainers' consumer group resumes from the snapshot's offsets ({len(report.offsets)})"
        )
    installed = report.checkpoint
    if manifest.checkpoint is None:
        installed = _install_dense_checkpoint(cfg, storage, manifest)
    if installed is not None:
        lines.append(f"the trainers resume from the snapshot's dense state: checkpoint {installed}")
    elif manifest.checkpoint is None and not (manifest.dense or {}).get("file"):
        lines.append(
            "the snapshot holds neither a trainer checkpoint nor dense weights: trainers resume from "
            "their own latest checkpoint"
        )
    else:
        lines.append(
            f"trainer.checkpoint_dir {cfg.trainer.checkpoint_dir} is not on this machine, so no checkpoint "
            "of the snapshot was installed: run this where it is, or trainers resume their newer dense state"
        )
    lines.append(dense)
    lines.append(
        "replicas read rows from the store: they see the restored rows now (after serving.local_cache_ttl_ms "
        "with a row cache); start the trainers when ready; `kelp model unpin` lets the dense weights "
        "follow new publishes again"
    )
    print("\n".join(lines))
    return 0


def _refuse_running_trainers(cfg: Any) -> None:
    """Trainers would commit over the restored offsets and train on half-restored rows: stopped first."""
    from kelp.config import KafkaSourceConfig
    from kelp.daemon.group_offsets import active_members

    if not isinstance(cfg.source, KafkaSourceConfig):
        return
    members = active_members(cfg.source)
    if members:
        raise UserError(
            f"consumer group {cfg.source.group_id!r} has {members} active member(s): stop every trainer "
            "of the deployment first (rollback --rows moves their rows and offsets back), then run it again"
        )


def _chosen_snapshot(storage: Any, deployment: str, snapshot_id: str | None, serving: int | None) -> Any:
    """The given snapshot, else the newest whole one whose dense version is below the served version.

    Below, not at: the snapshot taken while the bad version was served holds
    rows the bad data had already trained. With nothing published yet, the newest.
    """
    from kelp.store.snapshots.catalog import list_snapshots, read_manifest

    if snapshot_id is not None:
        return read_manifest(storage, deployment, snapshot_id)
    snapshots = list_snapshots(storage, deployment)
    if serving is None:
        eligible = snapshots
    else:
        eligible = [m for m in snapshots if m.dense is not None and int(m.dense["version"]) < serving]
    if not eligible:
        seen = ", ".join(f"{m.snapshot_id} (dense {_dense_version(m)})" for m in snapshots[-5:]) or "none"
        raise UserError(
            f"no whole row snapshot of {deployment!r} in {storage.describe()} with a dense version below "
            f"the served v{serving} (newest: {seen}); name one with --snapshot ID"
        )
    return eligible[-1]


def _dense_version(manifest: Any) -> str:
    return "-" if manifest.dense is None else f"v{manifest.dense['version']}"


def _serve_snapshot_dense(cfg: Any, channel: SnapshotChannel, storage: Any, manifest: Any) -> str:
    """Pin the snapshot's dense version; re-published from the snapshot's copy when the channel pruned it."""
    dense = manifest.dense
    if dense is None:
        return "the snapshot records no dense version: what replicas serve is unchanged"
    version = int(dense["version"])
    if version in channel.versions():
        _set_pin(channel, version)
        return f"replicas serve its dense weights: pinned v{version}"
    if not dense.get("file"):
        raise UserError(
            f"rows restored, but the snapshot's dense v{version} is no longer stored and the snapshot holds "
            "no copy of it; pin a version with `kelp model pin N`"
        )
    republished = _republish(cfg, channel, storage.get(dense["file"]), int(dense.get("step", 0)), manifest)
    _set_pin(channel, republished)
    return (
        f"replicas serve its dense weights: v{version} was pruned, re-published as v{republished} and pinned"
    )


def _dense_model(cfg: Any, weights: bytes) -> Any:
    """The configured model holding a published version's weights (safetensors of its state_dict)."""
    from safetensors.torch import load as st_load

    from kelp.trainer import build_model

    model = build_model(cfg.features, cfg.trainer)
    try:
        model.load_state_dict(st_load(weights), strict=True)
    except RuntimeError as exc:
        raise UserError(
            "the snapshot's dense weights do not fit the configured model: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from None
    return model


def _offsets_of(manifest: Any) -> dict[tuple[str, int], int]:
    return {(o["topic"], int(o["partition"])): int(o["offset"]) for o in manifest.offsets}


def _install_dense_checkpoint(cfg: Any, storage: Any, manifest: Any) -> str | None:
    """For a snapshot taken without a trainer checkpoint (`kelp store snapshot`): a checkpoint of its dense
    weights (the dense optimizer's state starts afresh), so restarted trainers do not resume the newer
    dense state the bad data trained. None when there are no weights or no checkpoint directory here."""
    from kelp.trainer.checkpoint import config_hash, save_checkpoint
    from kelp.trainer.fingerprint import fingerprint
    from kelp.trainer.optim import build_dense_optimizer

    dense, directory = manifest.dense, cfg.trainer.checkpoint_dir
    if dense is None or not dense.get("file") or not directory.is_dir():
        return None
    model = _dense_model(cfg, storage.get(dense["file"]))
    path = save_checkpoint(
        directory,
        model,
        build_dense_optimizer(model.parameters(), cfg.trainer.dense_optimizer),
        step=int(dense["step"]),
        config_hash=config_hash(cfg.features, cfg.trainer),
        offsets=_offsets_of(manifest),
        fingerprint=fingerprint(cfg.features, cfg.trainer),
    )
    return str(path)


def _republish(cfg: Any, channel: SnapshotChannel, weights: bytes, step: int, manifest: Any) -> int:
    """The snapshot's dense weights as a new version (the channel never reuses a number)."""
    from kelp.publish import build_snapshot

    model = _dense_model(cfg, weights)
    offsets = _offsets_of(manifest)
    version = channel.next_version()
    channel.write(
        build_snapshot(model, cfg.features, cfg.trainer, version=version, step=step, offsets=offsets)
    )
    return version
