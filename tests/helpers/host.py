"""What this host has: tests that need a host tool skip, naming it, where it is missing."""

import shutil

import pytest


def require_tool(name):
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed on this host")
