"""pytest's set-up for the whole repository: notebooks run in order, on one xdist worker."""
import pytest


def pytest_collection_modifyitems(config, items):
    """Every notebook cell in one xdist group (``--dist loadgroup``): notebooks read what earlier ones
    saved (03's eager chain in 04, for one), so they run one after the other, in order, on one worker,
    while the unit tests share the other workers. Collected first (``testpaths``), the group starts first."""
    for item in items:
        if item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("notebooks"))
