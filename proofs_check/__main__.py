"""``python -m proofs_check``: see :mod:`proofs_check.runner` for the options and exit status."""

from proofs_check.runner import main

raise SystemExit(main())
