"""Synthetic click events as JSON Lines, with a signal a two-tower model can learn.

Each user has a favourite category (often the one their country prefers); each
item has a category and a quality. A user clicks an item with probability
``sigmoid(-2.2 + 2.5·[item category is the favourite] + quality + 0.3·[evening])``,
so the user id, country, item id and category all carry signal. No third-party
data: everything comes from a seeded generator.

    python examples/two-tower/generate.py --events 50000 > clicks.jsonl

One event (nested, as an application would log it)::

    {"user": {"id": "u42", "country": "de"}, "item": {"id": 1234, "category": "shoes"},
     "ctx": {"hour": 13}, "clicked": 1, "ts": 1767225600.0}
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["CATEGORIES", "COUNTRIES", "World", "events"]

CATEGORIES = ("shoes", "books", "games", "garden", "music", "sports", "toys", "travel")
COUNTRIES = ("de", "fr", "us", "jp", "br", "in")
START_TS = 1_767_225_600.0  # 2026-01-01 UTC


class World:
    """Users and items with hidden tastes and qualities, fixed by ``seed``."""

    def __init__(self, users: int = 2000, items: int = 500, seed: int = 0) -> None:
        rng = random.Random(seed)
        favourite_of_country = {c: rng.choice(CATEGORIES) for c in COUNTRIES}
        self.users = []
        for u in range(users):
            country = rng.choice(COUNTRIES)
            fav = favourite_of_country[country] if rng.random() < 0.6 else rng.choice(CATEGORIES)
            self.users.append((f"u{u}", country, fav))
        self.items = [(1000 + i, rng.choice(CATEGORIES), rng.gauss(0.0, 0.6)) for i in range(items)]

    def click_probability(self, user: int, item: int, hour: int) -> float:
        _, _, fav = self.users[user]
        _, category, quality = self.items[item]
        logit = -2.2 + 2.5 * (category == fav) + quality + 0.3 * (hour >= 18)
        return 1.0 / (1.0 + math.exp(-logit))

    def event(self, user: int, item: int, hour: int, clicked: int, ts: float) -> dict[str, Any]:
        uid, country, _ = self.users[user]
        iid, category, _ = self.items[item]
        return {
            "user": {"id": uid, "country": country},
            "item": {"id": iid, "category": category},
            "ctx": {"hour": hour},
            "clicked": clicked,
            "ts": ts,
        }


def events(n: int, seed: int = 0, users: int = 2000, items: int = 500) -> Iterator[dict[str, Any]]:
    """``n`` events of one world (``seed``), one second apart; the clicks are drawn with ``seed + 1``."""
    world = World(users, items, seed)
    rng = random.Random(seed + 1)
    for k in range(n):
        user, item, hour = rng.randrange(users), rng.randrange(items), rng.randrange(24)
        clicked = int(rng.random() < world.click_probability(user, item, hour))
        yield world.event(user, item, hour, clicked, START_TS + k)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--out", default="-", help="a file, or - for stdout")
    args = parser.parse_args(argv)
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
    try:
        for event in events(args.events, args.seed, args.users, args.items):
            out.write(json.dumps(event, separators=(",", ":")) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
