"""``Closeable``: the one ``with obj: ...`` protocol for the things Kelp opens and must release.

Stores (connections, write-back buffers), sources (a consumer group, a file)
and snapshot channels all hold something that must be released even when the
block raises; each implements :meth:`Closeable.close` and inherits the
context-manager half from here.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closeable"]


class Closeable:
    """``with obj:`` calls ``obj.close()`` on the way out, whether or not the block raised."""

    def close(self) -> None:
        """Release what the object holds (connections, buffers, files); a no-op unless overridden."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
