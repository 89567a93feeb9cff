"""``kelp store import --config F --table T FILE [--replace] [--tensor NAME]``: pre-trained rows in.

The reading, checks and admission metadata are :mod:`kelp.daemon.row_import`'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kelp.config import load_config

__all__ = ["add_verbs"]


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """Adds ``import`` to ``kelp store``."""
    parser = verbs.add_parser(
        "import",
        help="load rows into a table: safetensors (ids, rows[, state]), a Kelp snapshot shard, "
        "or a torch/TorchRec state_dict",
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--table", required=True, help="the table the rows go to (its dim must match)")
    parser.add_argument("file", type=Path, help="the file to read (never unpickled)")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="delete the table's rows first (else a table with rows is refused)",
    )
    parser.add_argument(
        "--tensor",
        default=None,
        help="a state_dict's weight tensor, e.g. embedding_bags.t_user.weight (row index = id); "
        "needed when the file holds more than one 2-D tensor",
    )
    parser.set_defaults(handler=_import)


def _import(args: argparse.Namespace) -> int:
    from kelp.daemon.row_import import import_rows

    cfg = load_config(args.config)
    report = import_rows(cfg, args.table, args.file, replace=args.replace, tensor=args.tensor)
    dropped = f"; {report.dropped} rows deleted first" if args.replace else ""
    print(f"imported {report.rows} rows into {report.table} from {args.file} ({report.kind}){dropped}")
    return 0
