"""``python -m kelp.cli`` is the same as the ``kelp`` console script."""

import sys

from kelp.cli.main import main

sys.exit(main())
