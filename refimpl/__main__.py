"""``python -m refimpl``: the ``refimpl`` command line, for environments without its script."""

import sys

from refimpl.cli import main

sys.exit(main())
