"""``python -m hicachefs.cli``: the ``hicachefs`` command."""

import sys

from . import main

sys.exit(main())
