"""The conformance kit on the built-in backends, and the kit catching broken ones."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import commlib
from commlib.testing.conformance import (
    CHECKS,
    DEFAULT_WORLD_SIZES,
    ConformanceError,
    Kit,
    KitPool,
    run_conformance,
)
from tests.torch_build import nccl_reason

# slow: the whole kit at world sizes 1 to 3, on its own ranks
pytestmark = pytest.mark.slow

_kits = KitPool()


def _kit(backend: str) -> Kit:
    return _kits.get(backend)


@pytest.fixture(scope="module", autouse=True)
def _close_kits():
    yield
    _kits.close()


CASES = [
    (backend, size, name)
    for backend in ("single", "gloo")
    for size in DEFAULT_WORLD_SIZES
    for name, check in CHECKS.items()
    if check.applies(size) and (backend != "single" or size == 1)
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("backend", "size", "name"), CASES, ids=lambda v: str(v))
def test_builtin_backend_conforms(backend, size, name):
    result = _kit(backend).run(name, size)
    assert result.status == "passed", result.detail


def test_single_runs_at_world_size_one_only():
    result = _kit("single").run("all_reduce_ops", 2)
    assert result.status == "skipped" and "world size 1" in result.detail


def test_unavailable_backend_is_skipped_with_its_reason():
    with Kit("nccl") as kit:
        result = kit.run("barrier", 2)
    assert result.status == "skipped"
    assert f"cannot run here: {nccl_reason()}" in result.detail


# -- the kit notices broken backends --------------------------------------------------
class _WrongSum(commlib.Backend):
    """gloo whose all_reduce adds one too many."""

    name = "kit-wrong-sum"
    torch_backend = "gloo"

    def all_reduce(self, tensor, op, group, async_op=False):
        work = super().all_reduce(tensor, op, group, async_op)
        if op == "sum":
            if work is not None:
                work.wait()
            tensor.add_(1)
        return None


class _FixedSource(commlib.Backend):
    """gloo whose broadcast always sends from rank 0."""

    name = "kit-fixed-source"
    torch_backend = "gloo"

    def broadcast(self, tensor, src, group, async_op=False):
        return super().broadcast(tensor, 0, group, async_op)


class _PlainGloo(commlib.Backend):
    """gloo through torch.distributed alone: no way around the dtypes gloo refuses."""

    name = "kit-plain-gloo"
    torch_backend = "gloo"


def register_broken(rank: int, size: int) -> None:
    commlib.register_backend(_WrongSum)
    commlib.register_backend(_FixedSource)
    commlib.register_backend(_PlainGloo)


@pytest.mark.timeout(180)
def test_kit_reports_broken_backends():
    report = run_conformance(
        "kit-wrong-sum",
        world_sizes=(2,),
        setup=register_broken,
        checks=["all_reduce_ops", "gather"],
        raise_on_failure=False,
    )
    failed = {r.check: r.detail for r in report.failures}
    assert set(failed) == {"all_reduce_ops"}, str(report)
    assert "all_reduce sum" in failed["all_reduce_ops"]
    assert "1 failed" in str(report)
    with pytest.raises(ConformanceError, match="broadcast"):
        run_conformance(
            "kit-fixed-source", world_sizes=(2,), setup=register_broken, checks=["broadcast"]
        )


@pytest.mark.timeout(180)
def test_a_failed_collective_names_its_arguments_and_spares_later_checks():
    report = run_conformance(
        "kit-plain-gloo",
        world_sizes=(2,),
        setup=register_broken,
        checks=["reduce", "barrier", "all_reduce_ops"],
        raise_on_failure=False,
    )
    failed = {r.check: r.detail for r in report.failures}
    # gloo refuses int16: the failure says where, and the group it broke is not reused
    assert "reduce" in failed, str(report)
    assert "reduce(dst 0, sum, int16 (2, 3)) raised CommError" in failed["reduce"]
    assert "Invalid scalar type" in failed["reduce"]
    assert report.results[1].status == "passed", str(report)  # barrier, on fresh ranks


@pytest.mark.timeout(180)
def test_kit_reports_a_world_that_does_not_start():
    report = run_conformance(
        "kit-no-such-backend", world_sizes=(2,), checks=["barrier"], raise_on_failure=False
    )
    assert not report.ok and "did not start" in report.failures[0].detail


# -- the pytest plugin -----------------------------------------------------------------
@pytest.mark.timeout(300)
def test_pytest_plugin_runs_the_kit(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "--commlib-backend",
            "single",
            "--commlib-backend",
            "gloo",
            "--commlib-world-sizes",
            "1,2",
            "-k",
            "all_reduce or barrier",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    tail = proc.stdout.strip().splitlines()[-1]
    picked = len([n for n in CHECKS if "all_reduce" in n or "barrier" in n])
    # single: at world 1, skipped at 2; gloo: at both sizes
    assert f"{3 * picked} passed" in tail and f"{picked} skipped" in tail, tail


@pytest.mark.timeout(300)
def test_pytest_plugin_shows_failures(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import commlib\n"
        "class Lazy(commlib.Backend):\n"
        "    name = 'kit-lazy'\n"
        "    torch_backend = None\n"
        "    def unavailable_reason(self):\n"
        "        return None\n"
        "    def rank(self, group):\n"
        "        return 0\n"
        "    def world_size(self, group):\n"
        "        return 1\n"
        "    def all_reduce(self, tensor, op, group, async_op=False):\n"
        "        tensor.zero_()\n"
        "commlib.register_backend(Lazy)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--commlib-backend",
            "kit-lazy",
            "--commlib-world-sizes",
            "1",
            "-k",
            "all_reduce_ops",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "conformance[kit-lazy-world1-all_reduce_ops]" in proc.stdout
    assert "all_reduce sum torch.float32 on cpu: values" in proc.stdout


def test_checks_are_documented():
    for check in CHECKS.values():
        assert check.doc, f"{check.name} has no docstring"
    assert torch.distributed.is_available()
