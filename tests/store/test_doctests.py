"""The store's docstring examples run (they are documentation that must stay true)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "kelp.store.admission",
    "kelp.store.codec",
    "kelp.store.eviction",
    "kelp.store.factory",
    "kelp.store.hashing",
    "kelp.store.id_sets",
    "kelp.store.index",
    "kelp.store.keys",
    "kelp.store.memory",
    "kelp.store.quarantine",
    "kelp.store.resp",
    "kelp.store.resp_ints",
    "kelp.store.slots",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
