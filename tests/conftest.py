"""Shared by every test: importing `models` registers the learned schedulers in `sim.policies.POLICIES` (sim names
no models module), so a test of sim/ that loops over the registry sees them as every entry point does."""

import models  # noqa: F401 - registers the learned policies
