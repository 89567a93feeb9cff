"""``python -m kelp.daemon`` is the same as the ``kelp`` console script."""

import sys

from kelp.daemon.cli import main

sys.exit(main())
