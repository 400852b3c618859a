"""Candidates: a next rung under test, not yet used by the notebooks' workload."""
