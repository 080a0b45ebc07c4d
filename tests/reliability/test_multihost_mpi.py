"""The mpi backend across two hosts: network namespaces, ranks started by MPICH's hydra.

The hosts are test_multihost.py's (a bridge and two namespaces with one address each).
hydra's ``rsh`` bootstrap runs each host's proxy through a script that enters that
host's namespace (``ip netns exec``), ``-iface`` makes the proxies call back on the
test's interface. The namespaces share the machine's host name, and so three things a
real cluster gets from distinct host names are said outright: the store's address
(``MASTER_ADDR``: commlib's rendezvous would otherwise take the ranks for one machine
and use 127.0.0.1), and UCX's transport (``UCX_TLS=tcp,self`` on the test's device:
otherwise UCX, seeing one kernel, moves the data through shared memory and the test
would prove nothing), with MPICH told that no two ranks share a node
(``MPIR_CVAR_NOLOCAL``). The test checks that the 64 MiB all_reduce crossed the link.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.test_multihost import IFACE, Topology, _ip, topology  # noqa: F401

pytestmark = pytest.mark.slow
RANK_SCRIPT = Path(__file__).with_name("multihost_mpi_rank.py")


def _mpiexec() -> str | None:
    here = Path(sys.executable).with_name("mpiexec")
    return str(here) if os.access(here, os.X_OK) else None


def _sent_bytes(topo: Topology, host: int) -> int:
    out = _ip("-n", topo.hosts[host], "-s", "link", "show", IFACE).stdout.splitlines()
    at = next(i for i, line in enumerate(out) if line.strip().startswith("TX:"))
    return int(out[at + 1].split()[0])


@pytest.mark.timeout(180)
def test_mpi_ranks_on_two_hosts(topology, tmp_path):  # noqa: F811
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install 'commlib[mpi]')")
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec beside this Python")
    hosts = dict(zip(topology.addrs, topology.hosts))
    enter = tmp_path / "enter-host.sh"  # hydra's rsh bootstrap: HOST COMMAND...
    cases = "".join(f"  {a}) ns={n} ;;\n" for a, n in hosts.items())
    enter.write_text(
        '#!/bin/sh\nhost="$1"; shift\ncase "$host" in\n'
        + cases
        + '  *) echo "unknown host $host" >&2; exit 1 ;;\nesac\n'
        + 'exec ip netns exec "$ns" sh -c "$*"\n'
    )
    enter.chmod(0o755)
    before = _sent_bytes(topology, 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))}
    cmd = [
        "ip", "netns", "exec", topology.hosts[0],
        mpiexec, "-n", "2", "-ppn", "1", "-hosts", ",".join(topology.addrs),
        "-bootstrap", "rsh", "-bootstrap-exec", str(enter), "-iface", IFACE,
        "-genv", "MASTER_ADDR", topology.addrs[0],
        "-genv", "MPIR_CVAR_NOLOCAL", "1",
        "-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", IFACE,
        "-genv", "OMP_NUM_THREADS", "1",
        *(["-genv", "PYTHONPATH", env["PYTHONPATH"]] if "PYTHONPATH" in env else []),
        sys.executable, str(RANK_SCRIPT),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("result-rank*.json"))]
    assert [r["rank"] for r in results] == [0, 1], done.stdout
    for r in results:
        assert r["size"] == 2 and r["big"] == [3.0, 3.0] and r["pair"] == 1.0, r
        # each rank ran in its own host's namespace
        assert [o["host"] for o in r["objs"]] == topology.addrs, r
    sent = _sent_bytes(topology, 0) - before
    assert sent >= 32 << 20, f"only {sent} bytes crossed host 0's link: MPI took another path"
