"""``python -m hicachefs.daemon CONFIG_JSON [PROGRESS_FD]``: how ``hicachefs mount`` starts the
daemon in the background."""

import sys

from .daemon import main

sys.exit(main())
