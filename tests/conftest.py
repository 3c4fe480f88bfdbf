"""Shared pytest configuration: Hypothesis profiles and the backend under test.

Hypothesis profile, chosen by ``REFIMPL_HYPOTHESIS_PROFILE``:

- ``ci`` (default): 25 examples per property, derandomized and with no example
  database, so ``pytest`` on any checkout draws the examples CI drew and gives the
  same result twice in a row. (Hypothesis's own default draws new examples every
  run and replays failures from a local database, so a user's run could fail
  where CI passed, or pass where it had failed the day before.)
- ``thorough``: the same, with 250 examples: a longer run that is still repeatable.
- ``explore``: 250 fresh examples per property on every run, with the local
  example database, for hunting counterexamples. Pin each one it finds with
  ``@example`` (the failure report prints the example and a reproduction blob), so
  the default profile runs it from then on.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILES = {
    "ci": {"max_examples": 25, "derandomize": True, "database": None},
    "thorough": {"max_examples": 250, "derandomize": True, "database": None},
    "explore": {"max_examples": 250, "derandomize": False},
}

for name, choices in PROFILES.items():
    settings.register_profile(
        name,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        print_blob=True,
        **choices,
    )
settings.load_profile(os.environ.get("REFIMPL_HYPOTHESIS_PROFILE", "ci"))
