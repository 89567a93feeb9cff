"""The two figures Kelp draws: a run's learning curves, and the accuracy benchmark's overview."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kelp.errors import UserError
from kelp.plots.curves import Curve

__all__ = ["plot_accuracy", "plot_admission", "plot_learning"]


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or a one-line error saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("drawing needs matplotlib: pip install 'kelp[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _finite(values: Sequence[float]) -> bool:
    return any(math.isfinite(v) for v in values)


def plot_learning(curves: Sequence[Curve], path: Path, title: str) -> Path:
    """AUC (left) and log loss (right) against samples: solid windowed, dashed cumulative; a colour a run."""
    plt = _pyplot()
    fig, (auc_ax, loss_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, c in enumerate(curves):
        colour = f"C{i}"
        auc_ax.plot(c.samples, c.auc_window, color=colour, label=f"{c.label} (window)")
        auc_ax.plot(
            c.samples, c.auc_cumulative, color=colour, linestyle="--", label=f"{c.label} (cumulative)"
        )
        loss_ax.plot(c.samples, c.log_loss_window, color=colour, label=f"{c.label} (window)")
        loss_ax.plot(
            c.samples, c.log_loss_cumulative, color=colour, linestyle="--", label=f"{c.label} (cum.)"
        )
    auc_ax.set(xlabel="samples trained", ylabel="progressive AUC", title="AUC (scored before training)")
    loss_ax.set(xlabel="samples trained", ylabel="log loss", title="log loss")
    for ax in (auc_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if not any(_finite(c.auc_window) for c in curves):
        auc_ax.text(0.5, 0.5, "AUC undefined (one class so far)", ha="center", transform=auc_ax.transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_accuracy(
    sweep: Sequence[Mapping[str, Any]], curves: Mapping[str, Sequence[Curve]], path: Path, title: str
) -> Path:
    """Left: the admission/eviction sweep, AUC against rows stored. Right: windowed AUC over each stream."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 1 + len(curves), figsize=(6 * (1 + len(curves)), 5))
    ax = axes[0]
    for entry in sweep:
        marker = "o" if not entry.get("fallback") else "s"
        colour = "C0" if entry.get("ttl_s") is None and entry.get("max_rows") is None else "C3"
        ax.scatter(entry["rows_stored"], entry["auc"], marker=marker, color=colour)
        ax.annotate(
            entry["name"],
            (entry["rows_stored"], entry["auc"]),
            fontsize=6,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set(
        xlabel="rows stored at the end (fallback rows included)",
        ylabel="progressive AUC",
        title="MovieLens-100k: admission and eviction (o: no fallback, s: fallback; red: TTL/LFU)",
    )
    ax.title.set_fontsize(8)
    ax.grid(alpha=0.3)
    for ax, (stream, runs) in zip(axes[1:], curves.items(), strict=True):
        for i, c in enumerate(runs):
            ax.plot(c.samples, c.auc_window, color=f"C{i}", label=f"{c.label} (window)")
            ax.plot(
                c.samples, c.auc_cumulative, color=f"C{i}", linestyle="--", label=f"{c.label} (cumulative)"
            )
        ax.set(xlabel="samples", ylabel="progressive AUC", title=stream)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_admission(
    sweeps: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, title: str, rows_target: float
) -> Path:
    """The memory–AUC curve: AUC lost against the share of rows kept, per stream, Kelp beside the reference.

    Each sweep entry has ``min_count``, ``fallback``, ``rows_stored``, ``auc_cost`` and, where the
    reference ran, ``reference_rows`` and ``reference_auc_cost``.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 5), squeeze=False)
    for ax, (stream, sweep) in zip(axes[0], sweeps.items(), strict=True):
        per_id = [e for e in sweep if not e["fallback"] and e.get("first_order") == "per_id"]
        projection = [
            e for e in sweep if not e["fallback"] and e.get("first_order", "projection") == "projection"
        ]
        fallback = [e for e in sweep if e["fallback"]]
        plain = per_id or projection
        full = plain[0]["rows_stored"] if plain else 1
        lines = (
            (per_id, "Kelp deepfm, per-id first order", "o-"),
            (projection, "Kelp deepfm, projected first order (default)", "^-"),
            (projection[:1] + fallback, "Kelp, projected + fallback rows", "s--"),
        )
        for entries, label, style in lines:
            if entries:
                xs = [e["rows_stored"] / full for e in entries]
                ax.plot(xs, [e["auc_cost"] for e in entries], style, label=label)
                for e, x in zip(entries, xs, strict=True):
                    ax.annotate(
                        f"k={e['min_count']}",
                        (x, e["auc_cost"]),
                        fontsize=7,
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
        ref = [e for e in plain if "reference_auc_cost" in e]
        if ref:
            ref_full = ref[0]["reference_rows"] or 1
            ax.plot(
                [e["reference_rows"] / ref_full for e in ref],
                [e["reference_auc_cost"] for e in ref],
                "x:",
                label="reference FM + MLP",
            )
        ax.axvline(rows_target, color="grey", alpha=0.5, linestyle=":")
        ax.set(
            xlabel="rows kept (share of min_count 1's)", ylabel="AUC lost against min_count 1", title=stream
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)
