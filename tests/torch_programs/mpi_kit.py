"""The mpi kit's ranks for this package's tests: one pool, its world kept from module to module.

test_ddp.py and test_torch_apis.py run torch programs on ``commlib-mpi`` at 2 and 4
ranks in the kit's ranks (one ``mpiexec`` per size); the ranks a module leaves running
serve the next module's tests of that size. The package's conftest.py closes the pool
after the package's last test.
"""

from __future__ import annotations

import importlib.util

import pytest

import commlib
from commlib.testing.conformance import Kit, KitPool

_kits = KitPool()


def mpi_kit() -> Kit:
    """The mpi kit (its ranks start on first use); skips the test where mpi cannot run."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install 'commlib[mpi]')")
    from commlib_backends.mpi import MPIBackend

    try:
        plugin = commlib.plugins.resolve_backend("mpi")
    except ValueError:
        plugin = commlib.register_backend(MPIBackend)
    reason = plugin.unavailable_reason()
    if reason is None:
        try:
            plugin.launch_command(1)
        except FileNotFoundError as exc:
            reason = str(exc)
    if reason is not None:
        pytest.skip(f"mpi cannot run here: {reason}")
    return _kits.get("mpi", timeout=120.0)


def close() -> None:
    """End the kit's ranks (by pid)."""
    _kits.close()
