"""The bare dense all-reduce, timed: what ``docs/scaling.md``'s network term predicts.

Run by ``kelp bench scale`` under ``torch.distributed.run --nproc-per-node 2``::

    python -m kelp.bench.allreduce_probe --out FILE --floats 129297 --floats 1292970

Rank 0 writes ``{floats: median_seconds}``: one flat float32 tensor, SUM, gloo,
the same collective a trainer group step makes, with no training around it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--floats", type=int, action="append", required=True)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    result = {}
    for n in args.floats:
        tensor = torch.ones(n)
        dist.all_reduce(tensor)  # warm-up: connections and buffers
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - started)
        result[str(n)] = statistics.median(times)
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
