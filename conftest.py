"""pytest's set-up for the whole repository: under pytest-xdist (``-n``) the notebooks run in order, on one
worker, while the unit tests share the workers."""
import pytest


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown (and unused) where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """Every notebook cell in one work unit: notebooks read what earlier ones saved (03's eager chain in 04,
    06's sweep in 08), so they run one after the other, in order. Every unit test is a unit of its own. The
    largest unit, the notebooks, is handed out first."""
    from xdist.scheduler import LoadScopeScheduling

    class NotebooksInOrder(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "notebooks" if ".ipynb::" in nodeid else nodeid

    return NotebooksInOrder(config, log)
