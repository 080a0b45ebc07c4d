"""One broken plugin breaks nothing else.

Three really installed distributions (dist-info on a temporary path, found by
``importlib.metadata`` exactly as pip-installed ones are): one whose module
raises ImportError, one whose hook raises, and two that offer the same backend
name. Each becomes a row of ``commlib info`` saying why, and an error only for
whoever selects it; gloo, single and ``init_dist`` keep working, in worlds of
1, 2 and 3 ranks (each rank a process that found the broken plugins: one rank, and
an even and an odd world; 4 ranks proved nothing 3 did not, for 4 more processes).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

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


def _env(site: Path, **env: str) -> dict[str, str]:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), full.get("PYTHONPATH", "")])
    full.update(env)
    return full


def _python(site: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_env(site, **env),
        cwd=site,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _start(site: Path, code: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=_env(site, **env),
        cwd=site,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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
import sys, warnings, torch, commlib
from commlib import plugins

x = torch.ones(2)
with warnings.catch_warnings():  # under a launcher, before init_dist: a world of one
    warnings.simplefilter("ignore")
    commlib.all_reduce(x)                    # a single-process run is untouched
    assert commlib.get_backend() is None or commlib.get_world_size() == 1
for name in ("broken", "hookfail", "twin"):
    try:
        plugins.resolve_backend(name)
    except commlib.BackendUnavailableError as exc:
        print(name, "->", exc)
    else:
        sys.exit(f"selecting {name} did not raise")
commlib.init_dist("pytorch", backend="gloo", timeout=60)  # the others keep working
y = torch.ones(1)
commlib.all_reduce(y)
print("gloo ok", commlib.get_world_size(), y.item())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_selecting_a_broken_backend_is_the_only_error(site, world):
    port = str(_free_port())
    procs = [
        _start(
            site,
            SELECT,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
        )
        for rank in range(world)
    ]
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()  # ours, by pid
            raise
        assert proc.returncode == 0, f"rank {rank}: {err}"
        assert "broken -> backend 'broken' cannot be used: plugin failed to load" in out
        assert "ImportError: libfrob.so.3" in out
        assert "hookfail -> " in out and "RuntimeError: no licence server" in out
        assert "twin -> " in out and "registered twice" in out
        assert f"gloo ok {world} {float(world)}" in out, out
