"""Kelp's processes: the CLI, ``kelp train``, ``kelp serve``, the demo, health and lifecycle.

Process code lives here and only here; ``kelp.consumers`` and ``kelp.store``
never import it.
"""

__all__: list[str] = []
