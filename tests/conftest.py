"""Shared fixtures: gloo worlds started once per session and reused by every test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from commlib._world import world as commlib_state
from commlib.testing import World

# CI runs a fixed set of examples (a submission must not fail on a new random draw);
# local runs keep exploring, and what they find is kept in .hypothesis/
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Ranks fork from a server that imported torch once, instead of each importing it
# (seconds per rank, most of a world's start on 2 cores): every world the tests and
# the conformance kit start, the ones that must start afresh after a fault too
World.default_start_method = "forkserver"

_worlds: dict[int, World] = {}


def get_world(size: int) -> World:
    """The session's gloo world of ``size`` ranks (started on first use)."""
    world = _worlds.get(size)
    if world is None:
        world = _worlds[size] = World(size, timeout=60)
    return world.start()


@pytest.fixture(scope="session", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def world(request) -> World:
    """A gloo world of 1..4 ranks."""
    return get_world(request.param)


@pytest.fixture(scope="session", params=[2, 3, 4], ids=lambda n: f"world{n}")
def multi_world(request) -> World:
    """A gloo world of 2..4 ranks."""
    return get_world(request.param)


@pytest.fixture(scope="session")
def world2() -> World:
    return get_world(2)


@pytest.fixture(scope="session")
def world3() -> World:
    return get_world(3)


@pytest.fixture
def fake8():
    """A communicator over torch's fake process group of 8 (nothing is sent), rank 0.

    In this process, torch.distributed otherwise uninitialised: the dispatch
    benchmark's world (:mod:`commlib.bench.fake_world`), gloo's plugin re-pointed
    at it, unchecked.
    """
    import torch.distributed as dist

    import commlib
    from commlib.bench.fake_world import dispatch_plugin, fake_world

    assert not dist.is_initialized()
    plugin = dispatch_plugin(commlib.plugins.resolve_backend("gloo"))
    with fake_world(8, plugin) as comm:
        yield comm


@pytest.fixture
def fresh_commlib_state():
    """commlib's process state as a fresh process has it, for the test and after it."""
    commlib_state.reset()
    yield commlib_state
    commlib_state.reset()


def pip_install_into(project: Path, tmp_path_factory) -> Path:
    """Really install the distribution at ``project`` (no deps, offline) into a new directory.

    It is built from a copy, so no ``build/`` appears in the repository. Put the
    returned directory on ``PYTHONPATH`` (or ``sys.path``) to use it.
    """
    source = tmp_path_factory.mktemp("src") / project.name
    shutil.copytree(project, source)
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        timeout=180,
        cwd=source,
    )
    return target


def _world_size_of(item: pytest.Item) -> int:
    callspec = getattr(item, "callspec", None)
    return int(callspec.params.get("size", 0)) if callspec is not None else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A module that sets ``RANKS_BY_SIZE = True`` runs its tests grouped by their ``size``.

    Its tests share one world of ranks at a time (a conformance kit's): each change
    of size ends that world and starts another, seconds on 2 cores. Grouped, each
    size's world starts once. Tests without a ``size`` (no ranks) go first; within a
    size the order is the file's.
    """
    start = 0
    while start < len(items):
        module = getattr(items[start], "module", None)
        end = start + 1
        while end < len(items) and getattr(items[end], "module", None) is module:
            end += 1
        if getattr(module, "RANKS_BY_SIZE", False):
            items[start:end] = sorted(items[start:end], key=_world_size_of)
        start = end


def pytest_sessionfinish(session, exitstatus):
    for world in _worlds.values():
        world.close()
    _worlds.clear()
