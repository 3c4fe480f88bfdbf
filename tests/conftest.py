"""Shared pytest configuration: Hypothesis profiles and the backend under test.

Hypothesis profile: ``REFIMPL_HYPOTHESIS_PROFILE=ci`` (default, fast) or
``thorough`` (ten times the examples, for hunting counterexamples locally).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "thorough",
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("REFIMPL_HYPOTHESIS_PROFILE", "ci"))
