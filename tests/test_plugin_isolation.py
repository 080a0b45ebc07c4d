"""One broken plugin breaks nothing else.

Three really installed distributions (dist-info on a temporary path, found by
``importlib.metadata`` exactly as pip-installed ones are): one whose module
raises ImportError, one whose hook raises, and two that offer the same backend
name. Each becomes a row of ``commlib info`` saying why, and an error only for
whoever selects it; gloo, single and ``init_dist`` keep working.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

_DISTS = {
    # distribution name -> (entry point name, module name, module source)
    "broken-plugin": (
        "broken",
        "broken_plugin_mod",
        'raise ImportError("libfrob.so.3: cannot open shared object file")\n',
    ),
    "hookfail-plugin": (
        "hookfail",
        "hookfail_mod",
        """
        from commlib import hookimpl

        @hookimpl
        def commlib_backends():
            raise RuntimeError("no licence server")
        """,
    ),
    "twin-a": (
        "twin_a",
        "twin_a_mod",
        """
        from commlib import Backend, hookimpl

        class Twin(Backend):
            name = "twin"
            torch_backend = "gloo"

        @hookimpl
        def commlib_backends():
            return [Twin]
        """,
    ),
    "twin-b": (
        "twin_b",
        "twin_b_mod",
        """
        from commlib import Backend, hookimpl

        class Twin(Backend):
            name = "twin"
            torch_backend = "gloo"

        @hookimpl
        def commlib_backends():
            return [Twin]
        """,
    ),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    for dist, (ep, module, source) in _DISTS.items():
        info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[commlib.backends]\n{ep} = {module}\n")
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    return site


def _python(site: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), full.get("PYTHONPATH", "")])
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full,
        cwd=site,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_commlib_info_shows_broken_plugins_as_rows(site):
    proc = _python(site, "from commlib.cli import main; raise SystemExit(main(['info']))")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:] if line.strip()}
    assert " yes " in rows["gloo"] and " yes " in rows["single"]
    assert " no " in rows["broken"]
    assert "broken (broken-plugin 0.1)" in rows["broken"] and "libfrob.so.3" in rows["broken"]
    assert " no " in rows["hookfail"] and "no licence server" in rows["hookfail"]
    assert "hookfail-plugin 0.1" in rows["hookfail"]
    assert " no " in rows["twin"] and "registered twice" in rows["twin"]
    assert "twin-a 0.1" in rows["twin"] and "twin-b 0.1" in rows["twin"]


SELECT = """
import sys, torch, commlib
from commlib import plugins

x = torch.ones(2)
commlib.all_reduce(x)                        # a single-process run is untouched
assert commlib.get_backend() is None or commlib.get_world_size() == 1
for name in ("broken", "hookfail", "twin"):
    try:
        plugins.get_backend_plugin(name)
    except commlib.BackendUnavailableError as exc:
        print(name, "->", exc)
    else:
        sys.exit(f"selecting {name} did not raise")
commlib.init_dist("pytorch", backend="gloo")  # the others keep working
y = torch.ones(1)
commlib.all_reduce(y)
print("gloo ok", commlib.get_world_size(), y.item())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_selecting_a_broken_backend_is_the_only_error(site):
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }
    proc = _python(site, SELECT, **env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "broken -> backend 'broken' cannot be used: plugin failed to load" in out
    assert "ImportError: libfrob.so.3" in out
    assert "hookfail -> " in out and "RuntimeError: no licence server" in out
    assert "twin -> " in out and "registered twice" in out
    assert "gloo ok 1 1.0" in out
