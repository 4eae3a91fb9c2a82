"""Shared test set-up: a deterministic hypothesis profile for CI and ``scripts/test``
(``HYPOTHESIS_PROFILE=ci``): its examples, and so its time, are the same on every run, where
random ones once took a property test from 20 s to 290 s."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "dev"))
