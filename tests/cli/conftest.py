"""The command-line tests' fixture: the environment a fresh caller runs `carbonsched` in."""

from __future__ import annotations

import pytest

from cli_process import clean_env


@pytest.fixture
def cli_env(tmp_path) -> dict[str, str]:
    """The caller's environment without any CARBONSCHED_* settings, state under tmp_path."""
    return clean_env(tmp_path)
