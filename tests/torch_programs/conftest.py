"""The package's mpi kit (tests/torch_programs/mpi_kit.py) ends after its last test."""

from __future__ import annotations

import pytest

from tests.torch_programs import mpi_kit


@pytest.fixture(scope="package", autouse=True)
def _mpi_kit_closed_after_the_package():
    yield
    mpi_kit.close()
