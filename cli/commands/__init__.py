"""One module per ``kelp`` sub-command; each exposes ``register(subparsers)``.

A handler receives the parsed ``argparse.Namespace`` and returns an exit code.
"""

__all__: list[str] = []
