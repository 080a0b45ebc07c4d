"""The docstring examples of every module run as doctests, in a world of one process.

Each module of ``commlib`` and ``commlib_backends`` is one test. Its ``>>>``
examples run in the module's own namespace plus a shared one: ``torch``, ``np``,
``commlib``, ``dist`` (``torch.distributed``), ``comm`` (a ``commlib.Communicator()``:
torch.distributed is not initialised here, so the ``single`` backend's world of
one), ``Communicator``, ``datetime``, ``os``, and for the internal protocols
(``commlib._objects``, ...) ``comm``'s ``engine`` and ``serializer``.

Lines that need several ranks, an accelerator, a launcher, the network or
files, or that would change torch for the rest of the process (the simulated
devices), carry ``# doctest: +SKIP`` in the docstring itself. Each test leaves
the process as it found it: an example that registers a backend or a
conformance check, installs a simulated device, or changes the environment
fails its module's test.
"""

from __future__ import annotations

import datetime
import doctest
import importlib
import os
import pkgutil
import random
import sys
import tempfile
import types
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import commlib
from commlib import plugins
from commlib._engine import Engine
from commlib._world import world
from commlib.testing import samples, simulated
from commlib.testing.checks import CHECKS

PACKAGES = ("commlib", "commlib_backends")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def module_names() -> list[str]:
    """Every module of the packages, by its import name (``commlib_backends.gloo``)."""
    names = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package_name + ".")]
    return sorted(names)


def namespace() -> dict[str, Any]:
    """What every example may use without importing it."""
    comm = commlib.Communicator()
    return {
        "torch": torch,
        "np": np,
        "commlib": commlib,
        "dist": dist,
        "comm": comm,
        "Communicator": commlib.Communicator,
        "datetime": datetime,
        "os": os,
        "engine": Engine(comm.plugin, comm.group, comm.timeout),
        "serializer": comm.serializer,
    }


def run_doctests(module: types.ModuleType) -> tuple[int, int, str]:
    """Run ``module``'s examples: (failed, attempted, doctest's report of the failures)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    for test in finder.find(module, module.__name__, extraglobs=namespace()):
        runner.run(test, out=report.append)
    return runner.failures, runner.tries, "".join(report)


def _process_state() -> dict[str, Any]:
    """What an example could change for the rest of the pytest process."""
    return {
        "backends": [(b.name, b.plugin, b.available) for b in plugins.list_backends()],
        "backends registered at run time": plugins.saved_state().runtime,
        "observers": plugins.list_observers(),
        "conformance checks": sorted(CHECKS),
        "sample object sources": list(samples._extra_sources),
        "simulated devices": {kind: simulated.installed(kind) for kind in simulated.KINDS},
        "vendor packages": [m for m in ("torch_npu", "torch_mlu") if m in sys.modules],
        "privateuse1 name": torch._C._get_privateuse1_backend_name(),
        "torch.cuda": (torch.cuda.is_available, torch.cuda.device_count),
        "torch.distributed engines": (dist.is_nccl_available(), sorted(dist.Backend._plugins)),
        "torch.distributed initialised": dist.is_initialized(),
        "environment": dict(os.environ),
        "default dtype": torch.get_default_dtype(),
    }


def check_examples(module: types.ModuleType) -> int:
    """Run ``module``'s examples; fail on a failed one or a changed process. How many ran."""
    before = _process_state()
    world.reset()  # each module's examples start in the state of a fresh process
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    registry = plugins.saved_state()  # commlib.plugins.refresh() makes new plugin instances
    try:
        failed, tried, report = run_doctests(module)
    finally:
        after = _process_state()
        # what examples may change by design (the default communicator, seeds, the
        # plugin cache) is put back, commlib's process state as a fresh process has it;
        # so is the rest, so that one failure does not spread
        plugins.restore_state(registry)
        world.reset()
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        os.environ.clear()
        os.environ.update(before["environment"])
    assert not failed, f"{failed} docstring example(s) of {module.__name__} failed:\n{report}"
    changed = [key for key in before if before[key] != after[key]]
    assert not changed, f"the examples of {module.__name__} changed the process: {changed}"
    return tried


@pytest.mark.parametrize("name", module_names())
def test_module_examples(name: str, tmp_path, monkeypatch) -> None:
    # examples make directories with tempfile.mkdtemp(): in this test's, not the system's
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    check_examples(importlib.import_module(name))


def test_pytest_entry_point_examples() -> None:
    """The top-level ``pytest11`` module, outside both packages, runs its examples too."""
    assert check_examples(importlib.import_module("_commlib_pytestplugin")) > 0
