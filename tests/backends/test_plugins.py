"""The plugin system: built-ins by entry point, run-time registration, installed plugins."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import commlib
from commlib import Backend, plugins
from commlib.cli import main as cli_main
from tests.conftest import pip_install_into

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


class Echo(Backend):
    name = "echo-test"
    torch_backend = "gloo"


@pytest.fixture
def clean_registry():
    yield
    for name in ("echo-test",):
        try:
            commlib.unregister_backend(name)
        except ValueError:
            pass


def test_builtins_come_from_entry_points():
    infos = {b.name: b for b in commlib.list_backends()}
    assert {"single", "gloo"} <= set(infos)
    # registered through the same group a third-party plugin uses
    assert infos["gloo"].plugin == "gloo" and infos["single"].plugin == "single"
    assert infos["gloo"].available and infos["gloo"].reason is None
    assert infos["gloo"].torch_backend == "gloo" and infos["gloo"].device_type == "cpu"
    assert infos["single"].torch_backend is None


def test_core_imports_no_backend_module_by_name():
    core = Path(commlib.__file__).parent
    for path in core.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.startswith("commlib_backends") for n in names), path


def test_register_backend_at_run_time(clean_registry):
    inst = commlib.register_backend(Echo)
    assert plugins.resolve_backend("echo-test") is inst
    assert "echo-test" in [b.name for b in commlib.list_backends()]
    with pytest.raises(ValueError, match="already registered"):
        commlib.register_backend(Echo)
    again = commlib.register_backend(Echo(), replace=True)
    assert plugins.resolve_backend("echo-test") is again
    # the engine's own plugin still serves gloo groups
    assert plugins.backend_for_group("gloo").name == "gloo"


def test_register_builtin_name_needs_replace():
    class FakeGloo(Backend):
        name = "gloo"
        torch_backend = "gloo"

    with pytest.raises(ValueError, match="already registered"):
        commlib.register_backend(FakeGloo)


def test_register_rejects_non_backends():
    with pytest.raises(TypeError):
        commlib.register_backend(object)

    class Nameless(Backend):
        pass

    with pytest.raises(ValueError, match="no name"):
        commlib.register_backend(Nameless)


def test_unknown_backend_lists_known_ones():
    with pytest.raises(ValueError, match=r"registered: .*gloo"):
        plugins.resolve_backend("nope")
    with pytest.raises(ValueError, match="drives"):
        plugins.backend_for_group("nope")


def test_get_backend_plugin_is_a_deprecated_alias_for_plugin_names():
    # plugins written against the older plugin guide call it: same plugin, a warning
    with pytest.warns(DeprecationWarning, match="resolve_backend"):
        assert plugins.get_backend_plugin("gloo") is plugins.resolve_backend("gloo")
    # and, as before, only a plugin's name: a device is resolve_backend's
    assert plugins.resolve_backend("cpu").name == "gloo"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"registered: .*gloo"):
        plugins.get_backend_plugin("cpu")


@pytest.mark.parametrize("name", ["nccl", "hccl", "cncl"])
def test_selecting_a_backend_this_machine_lacks_says_why(name):
    plugin = commlib.plugins.resolve_backend(name)
    reason = plugin.unavailable_reason()
    if reason is None:
        pytest.skip(f"{name} is available here")
    # before any engine call: torch's own failure would name neither backend nor reason
    with pytest.raises(commlib.BackendUnavailableError, match=f"'{name}'.*{re.escape(reason)}"):
        commlib.Communicator(backend=name)
    with pytest.raises(commlib.BackendUnavailableError, match=re.escape(reason)):
        commlib.Communicator(backend=plugin)
    # and by its device's name, which torch itself may not know without the extension
    device = f"{plugin.device_type}:1"
    assert plugins.resolve_backend(plugin.device_type) is plugin
    assert plugins.resolve_backend(device) is plugin
    with pytest.raises(commlib.BackendUnavailableError, match=re.escape(reason)):
        commlib.Communicator(backend=plugin.device_type)


def test_pluggy_plugin_registration(clean_registry):
    class Plugin:
        @commlib.hookimpl
        def commlib_backends(self):
            return [Echo]

    pm = plugins.plugin_manager()
    p = Plugin()
    pm.register(p, name="echo-plugin")
    try:
        plugins.refresh()
        info = {b.name: b for b in commlib.list_backends()}["echo-test"]
        assert info.plugin == "echo-plugin"
        # the same name from a second source is an error naming both
        pm.register(
            types.SimpleNamespace(commlib_backends=commlib.hookimpl(lambda: [Echo])), name="twin"
        )
        plugins.refresh()
        # a row saying why, an error only for whoever selects it; the rest works
        row = {b.name: b for b in commlib.list_backends()}["echo-test"]
        assert not row.available and "registered twice" in row.reason
        assert "echo-plugin" in row.reason and "twin" in row.reason
        with pytest.raises(commlib.BackendUnavailableError, match="registered twice"):
            plugins.resolve_backend("echo-test")
        assert plugins.resolve_backend("gloo").name == "gloo"
        pm.unregister(name="twin")
    finally:
        pm.unregister(p)
        plugins.refresh()
    assert "echo-test" not in [b.name for b in commlib.list_backends()]


def test_commlib_info(capsys):
    assert cli_main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch " + torch.__version__ in out
    assert "gloo" in out and "single" in out and "default backend: gloo" in out


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """tests/backends/plugin_dist, really installed (pip, no deps) into a temporary directory."""
    target = pip_install_into(HERE / "plugin_dist", tmp_path_factory)
    assert list(target.glob("commlib_test_plugin-*.dist-info"))
    return target


def _env_with(path: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return env


def test_installed_plugin_appears_in_info(installed_plugin):
    out = subprocess.run(
        [sys.executable, "-m", "commlib.cli", "info"],
        env=_env_with(installed_plugin),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    lines = {line.split()[0]: line for line in out.splitlines()[3:] if line.strip()}
    assert "counting-gloo" in lines and " yes " in lines["counting-gloo"]
    assert "frob" in lines and "the frobnicator is not plugged in" in lines["frob"]
    assert "testplugin (commlib-test-plugin 0.0.1)" in lines["counting-gloo"]


def test_installed_plugin_serves_a_gloo_world(installed_plugin):
    code = (
        "from commlib.testing import World\n"
        "from tests.backends.test_plugins import _count_all_reduce\n"
        "with World(2, backend='counting-gloo') as w:\n"
        "    print(w.run(_count_all_reduce))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env_with(installed_plugin),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('counting-gloo', 3.0, 1), ('counting-gloo', 3.0, 1)]"


def _count_all_reduce(comm):
    x = torch.tensor([1.0 + comm.rank])
    comm.all_reduce(x)
    return comm.backend, x.item(), type(comm.plugin).calls


def test_every_package_is_installed_by_pyproject():
    # a package missing from the explicit list installs a `commlib` that breaks
    import tomllib

    root = ROOT
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(root).parts) for p in (root / "commlib").rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)
    assert "commlib_backends" in listed and (root / "commlib_backends" / "__init__.py").exists()
