"""Kelp: streaming online learning for recommendation models.

The root package holds only what every room of the system shares: the error
tree (:mod:`kelp.errors`), the retry policy (:mod:`kelp.retry`), logging set-up
(:mod:`kelp.logs`) and the metric naming rules (:mod:`kelp.metrics`). The rooms
themselves live in their own top-level folders, mapped into this namespace:
``kelp.config``, ``kelp.consumers``, ``kelp.store``, ``kelp.daemon`` and
``kelp.harness``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kelp")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
