"""Package names resolved on first use (PEP 562), for packages whose modules import torch.

torch takes seconds to import. A package that re-exports its modules' names
eagerly makes every importer pay that, including ``kelp`` commands that only
read a config or call a health endpoint. :func:`lazy_exports` gives such a
package a module ``__getattr__`` and ``__dir__`` that import the home module of
a name the first time it is asked for.

Example::

    __getattr__, __dir__ = lazy_exports(__name__, {"kelp.publish.base": ("SnapshotChannel",)})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, each name imported from its home module once."""
    module_of = {name: module for module, names in homes.items() for name in names}

    def module_getattr(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def module_dir() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return module_getattr, module_dir
