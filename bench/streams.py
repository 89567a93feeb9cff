"""The real, time-ordered streams of ``kelp bench accuracy``, read straight from the raw files.

Each loader returns a :class:`Stream`: one-hot ids per feature, labels and
event times, in replay order. It is what the reference model trains on; Kelp
reads the same files through its own CSV source (the example configs), so the
two paths share no parsing code.

* ``criteo-attribution`` (``train.csv.gz``): rows sorted by ``orig_row`` (the
  original log order); features cat1, cat4, cat6, cat8, cat9; label ``click``,
  and ``conversion`` as a second label where the file has that column (the
  full Criteo Attribution dataset has it; the sample Kelp ships does not).
* ``movielens-100k`` (``u.data`` + ``u.item``): ratings sorted by time (stable);
  label = rating >= 4 (implicit feedback); features user, item and the film's
  first genre flag (``unknown`` first, as in ``u.item``'s column order).
* ``taobao-userbehavior`` (``UserBehavior.csv``, no header, already in time
  order: replayed in file order): one sample per event, features user, item and
  category; two labels from the behaviour (:data:`TAOBAO_TASKS`): ``engaged``
  (anything beyond a page view) and ``buy``. Not shipped and not redistributed:
  it is read from the data folder only.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kelp.errors import UserError
from kelp.examples import data_dir

__all__ = [
    "CRITEO_ATTRIBUTION",
    "CRITEO_ATTRIBUTION_TASKS",
    "MOVIELENS",
    "NOT_SHIPPED",
    "SHIPPED_DATA",
    "TAOBAO",
    "TAOBAO_COLUMNS",
    "TAOBAO_FILE",
    "TAOBAO_POSITIVE_BEHAVIORS",
    "TAOBAO_TASKS",
    "Stream",
    "load_stream",
    "stream_folder",
]

CRITEO_ATTRIBUTION = "criteo-attribution"
CRITEO_ATTRIBUTION_TASKS = ("click", "conversion")
"""The two labels of criteo-attribution's two-task run, in task order."""
MOVIELENS = "movielens-100k"
TAOBAO = "taobao-userbehavior"
TAOBAO_FILE = "UserBehavior.csv"
TAOBAO_COLUMNS = ("user", "item", "category", "behavior", "unix_ts")
"""``UserBehavior.csv``'s columns (the file has no header row)."""
TAOBAO_TASKS = ("engaged", "buy")
"""The two labels of Taobao's two-task run, in task order."""
TAOBAO_POSITIVE_BEHAVIORS: dict[str, frozenset[str]] = {
    "engaged": frozenset({"cart", "fav", "buy"}),
    "buy": frozenset({"buy"}),
}
"""Each Taobao task's label is 1 where the event's behaviour is one of its set (``pv``: a page view).

The one definition both sides of the two-task run use (the reference's
loader here, Kelp's JSON Lines in :mod:`kelp.bench.accuracy_tasks`); each
side still reads and orders the file itself.
"""
SHIPPED_DATA = data_dir()
"""The samples Kelp ships (criteo-attribution's train split among them; MovieLens is not redistributed)."""
NOT_SHIPPED = {
    MOVIELENS: "MovieLens is not redistributed: download ml-100k from grouplens.org",
    TAOBAO: "Kelp does not ship Taobao UserBehavior (Tianchi's terms); ../shared/data beside a checkout "
    "has it",
}
"""Where to get each stream Kelp may not ship, for the error that names a missing folder."""


@dataclass(frozen=True)
class Stream:
    """``ids`` int64[N, F] (column f = ``features[f]``), ``labels`` f32[N], ``ts`` f64[N] (NaN: none).

    ``labels`` is the label named ``label``; ``extra_labels`` holds any other
    label the file has (name -> f32[N]), for runs with several tasks.
    """

    name: str
    features: tuple[str, ...]
    ids: np.ndarray
    labels: np.ndarray
    ts: np.ndarray
    label: str = "label"
    extra_labels: Mapping[str, np.ndarray] = field(default_factory=dict)

    def head(self, n: int | None) -> Stream:
        """The first ``n`` samples (all when None)."""
        if n is None or n >= len(self.labels):
            return self
        extra = {k: v[:n] for k, v in self.extra_labels.items()}
        return Stream(self.name, self.features, self.ids[:n], self.labels[:n], self.ts[:n], self.label, extra)

    def has_labels(self, tasks: Sequence[str]) -> bool:
        return all(t == self.label or t in self.extra_labels for t in tasks)

    def task_labels(self, tasks: Sequence[str]) -> np.ndarray:
        """f32[N, T], column t = the label named ``tasks[t]``; a KeyError names a label the stream lacks."""
        columns = []
        for task in tasks:
            if task != self.label and task not in self.extra_labels:
                known = [self.label, *self.extra_labels]
                raise KeyError(f"{self.name} has no label {task!r} (it has {known})")
            columns.append(self.labels if task == self.label else self.extra_labels[task])
        return np.stack(columns, axis=1).astype(np.float32, copy=False)


def _criteo_attribution(folder: Path) -> Stream:
    features = ("cat1", "cat4", "cat6", "cat8", "cat9")
    with gzip.open(folder / "train.csv.gz", "rt", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows.sort(key=lambda r: int(r["orig_row"]))
    ids = np.array([[int(r[f]) for f in features] for r in rows], dtype=np.int64)
    labels = np.array([float(r["click"]) for r in rows], dtype=np.float32)
    extra = {
        name: np.array([float(r[name]) for r in rows], dtype=np.float32)
        for name in CRITEO_ATTRIBUTION_TASKS[1:]
        if rows and name in rows[0]
    }
    return Stream(CRITEO_ATTRIBUTION, features, ids, labels, np.full(len(rows), np.nan), "click", extra)


def _movielens(folder: Path) -> Stream:
    ratings = np.loadtxt(folder / "u.data", dtype=np.int64, delimiter="\t")
    ratings = ratings[np.argsort(ratings[:, 3], kind="stable")]
    genre: dict[int, int] = {}
    with open(folder / "u.item", encoding="latin-1") as fh:
        next(fh)  # the header line
        for line in fh:
            fields = line.rstrip("\n").split("|")
            flags = fields[5:]
            genre[int(fields[0])] = next((i for i, v in enumerate(flags) if v == "1"), -1)
    genres = np.array([genre.get(int(i), -1) for i in ratings[:, 1]], dtype=np.int64)
    ids = np.stack([ratings[:, 0], ratings[:, 1], genres], axis=1)
    labels = (ratings[:, 2] >= 4).astype(np.float32)
    return Stream(MOVIELENS, ("user", "item", "genre"), ids, labels, ratings[:, 3].astype(np.float64))


def _taobao(folder: Path) -> Stream:
    with open(folder / TAOBAO_FILE, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, fieldnames=TAOBAO_COLUMNS))
    features = ("user", "item", "category")
    ids = np.array([[int(r[f]) for f in features] for r in rows], dtype=np.int64)
    labels = {
        task: np.array([r["behavior"] in TAOBAO_POSITIVE_BEHAVIORS[task] for r in rows], dtype=np.float32)
        for task in TAOBAO_TASKS
    }
    first, *rest = TAOBAO_TASKS
    ts = np.array([float(r["unix_ts"]) for r in rows], dtype=np.float64)
    return Stream(TAOBAO, features, ids, labels[first], ts, first, {t: labels[t] for t in rest})


_LOADERS = {CRITEO_ATTRIBUTION: _criteo_attribution, MOVIELENS: _movielens, TAOBAO: _taobao}


def stream_folder(name: str, data_dir: Path) -> Path:
    """``data_dir/<name>/`` where it exists, else the copy shipped in ``examples/data`` when there is one.

    So ``--data DIR`` holding only MovieLens (which Kelp may not redistribute)
    still finds the shipped criteo-attribution sample.
    """
    folder = data_dir / name
    shipped = SHIPPED_DATA / name
    return shipped if not folder.is_dir() and shipped.is_dir() else folder


def load_stream(name: str, data_dir: Path) -> Stream:
    """The stream ``name`` from :func:`stream_folder`; a one-line error where the files are missing."""
    folder = stream_folder(name, data_dir)
    if not folder.is_dir():
        hint = f" ({NOT_SHIPPED[name]})" if name in NOT_SHIPPED else ""
        raise UserError(f"{folder}: not found; pass --data DIR holding {name}/{hint}")
    return _LOADERS[name](folder)
