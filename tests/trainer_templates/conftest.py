"""The ``slow`` marker: tests that run training scripts as subprocesses (seconds each). They run
in the default invocation; ``-m "not slow"`` leaves them out while editing."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: runs training scripts as subprocesses (seconds each)")
