"""commlib across hosts: two network namespaces, each a "host" running torchrun.

Topology, built afresh for each test and torn down after it (also on failure)::

                   netns <tag>-sw: bridge br0 (no addresses)
                    port p0                         port p1
                       │ veth                          │ veth
    netns <tag>-h0: mh0 10.231.7.1/24      netns <tag>-h1: mh0 10.231.7.2/24
      torchrun, 2 workers: ranks 0, 1        torchrun, 2 workers: ranks 2, 3
      (c10d rendezvous endpoint, and the     (joins the rendezvous at
      process group's store)                 10.231.7.1:29400)

Every veth is created inside the switch namespace with its peer placed straight
into a host namespace, so no test interface ever exists in the root namespace.
A host namespace holds only ``lo`` and ``mh0``, IPv6 off, and one route: the
test subnet's. There is no default route, so a packet to any other address
fails with "network unreachable" before it is sent: all traffic stays between
the namespaces' own addresses. The namespaces share the file system (the cwd
and ``collect_results``' tmpdir are shared, as on a cluster's shared disk).

gloo binds ``mh0`` (``GLOO_SOCKET_IFNAME``) and torchrun advertises the
namespace's address (``--local-addr``); the hostname, which both namespaces
share, is never used to find a peer.

Scenarios:

* conformance: every collective and helper, with peers on the other host, and
  each rank's observations checked against the expected values here.
* a host is killed mid-loop: SIGKILL to everything in host 1's namespace (its
  torchrun agent's process group, and the workers, which torchrun starts in
  sessions of their own). ``kill`` (the shrink test): the kernel closes host
  1's sockets, so host 0's ranks see the connections drop; they then shrink
  their communicator to the two of them (the rendezvous store lives in host
  0's torchrun agent), check every collective on it and exit normally.
  ``vanish``: host 1's link goes down first (a power cut, a pulled cable):
  nothing tells host 0, so its ranks can only notice by their communicator
  timeout; they re-raise, and host 0's torchrun must end by itself. Either way
  each surviving rank must raise a commlib error within the timeout (plus a
  little) and nothing may hang.

The tests skip, with the reason, where namespaces cannot be made (not root,
no ``ip`` from iproute2, no netns/veth/bridge support): the check tries it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.reliability.multihost_rank import ITEMS, big_array, digest

# slow: two hosts in network namespaces, each a torchrun
pytestmark = pytest.mark.slow

RANK_SCRIPT = Path(__file__).with_name("multihost_rank.py")
HOSTS = 2
NPROC = 2  # workers per host
WORLD = HOSTS * NPROC
SUBNET = "10.231.7"  # a private /24 that exists only inside the test's namespaces
IFACE = "mh0"
RDZV_PORT = 29400  # any port: the namespaces are fresh, nothing else listens there
TIMEOUT = 10.0  # communicator and process-group timeout of the ranks, seconds
# the communicator timeout of the vanish test, whose survivors can only wait it out: short,
# the loop's collectives take milliseconds (the ranks still join with TIMEOUT)
VANISH_TIMEOUT = 5.0
SLACK = 8.0  # how much later than TIMEOUT a rank may raise (2 busy cores)
START = 90.0  # seconds allowed for both hosts' torchrun to start and rendezvous
# a survivor raises within TIMEOUT, then waits up to 3 * TIMEOUT for its local
# sibling (multihost_rank.py), then torchrun reports the failure and exits
EXIT_WITHIN = 3 * TIMEOUT + 20

# launcher variables from the calling environment must not leak into torchrun's workers
_LAUNCH_VARS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


@functools.cache
def _netns_unavailable() -> str | None:
    """Why namespaces cannot be used here, or None; found by trying."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if shutil.which("ip") is None:
        return "`ip` is missing (Debian: apt-get install -y iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"commlib-mh-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _ip("-n", probe, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", probe, "link", "add", "name", "v0", "type", "veth", "peer", "name", "v1")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces work but veth/bridge links do not: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class Topology:
    """The namespaces, links and torchrun processes of one test; ``destroy`` undoes all."""

    def __init__(self, tag: str):
        self.switch = f"{tag}-sw"
        self.hosts = [f"{tag}-h{i}" for i in range(HOSTS)]
        self.addrs = [f"{SUBNET}.{i + 1}" for i in range(HOSTS)]
        self.created: list[str] = []
        self.agents: dict[int, subprocess.Popen] = {}
        self._logs: list = []

    def build(self) -> None:
        for ns in [self.switch, *self.hosts]:
            _ip("netns", "add", ns)
            self.created.append(ns)
            # one address per interface: gloo and torchrun only ever see the test's IPv4
            # (the file is absent on kernels without IPv6, which is as good)
            _ip("netns", "exec", ns, "sh", "-c",
                "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6", check=False)  # fmt: skip
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.hosts, self.addrs)):
            port = f"p{i}"
            _ip("-n", self.switch, "link", "add", "name", port, "type", "veth",
                "peer", "name", IFACE, "netns", ns)  # fmt: skip
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
        for ns in self.hosts:
            # the guarantee that no traffic leaves: the subnet's route and nothing else
            routes = _ip("-n", ns, "-4", "route", "show", "table", "all").stdout
            outside = [
                r
                for r in routes.splitlines()
                if r.split()
                and r.split()[0] not in ("local", "broadcast")
                and not r.startswith(f"{SUBNET}.0/24 ")
            ]
            assert not outside, f"{ns} has routes out of the test subnet: {outside}"

    def pids(self, host: int) -> list[int]:
        """Every process in the host's namespace: all of them were started by this test."""
        out = _ip("netns", "pids", self.hosts[host], check=False).stdout
        return [int(p) for p in out.split()]

    def torchrun(
        self, host: int, mode: str, outdir: Path, rdzv_id: str, timeout: float = TIMEOUT
    ) -> subprocess.Popen:
        cmd = [
            "ip", "netns", "exec", self.hosts[host],  # execs in place: the pid is torchrun's
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(HOSTS),
            "--nproc-per-node", str(NPROC),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{self.addrs[0]}:{RDZV_PORT}",
            "--rdzv-id", rdzv_id,
            # host 0 serves the rendezvous store; said outright rather than guessed
            # from the hostname, which both namespaces share
            "--rdzv-conf", f"is_host={'true' if host == 0 else 'false'},join_timeout={START:g}",
            "--local-addr", self.addrs[host],
            "--max-restarts", "0",
            "--monitor-interval", "0.1",
            str(RANK_SCRIPT), mode, str(outdir),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
        env.update(
            GLOO_SOCKET_IFNAME=IFACE,
            TP_SOCKET_IFNAME=IFACE,
            MH_HOST=str(host),
            MH_TIMEOUT=str(timeout),
            COMMLIB_TIMEOUT=str(timeout),
            OMP_NUM_THREADS="1",  # 6 processes share 2 cores
            TMPDIR=str(outdir),  # torchrun's log dirs: the test's, not the system's
            PYTHONUNBUFFERED="1",
        )
        log = open(outdir / f"torchrun-h{host}.log", "w")  # closed in destroy
        self._logs.append(log)
        # a session of its own: its process group is the agent's, to kill by pid
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=outdir, env=env, start_new_session=True
        )
        self.agents[host] = proc
        return proc

    def kill_host(self, host: int) -> None:
        """SIGKILL the host's torchrun agent's process group, then whatever is left there.

        torchrun starts each worker in a session of its own, so the workers are
        found through the namespace (``ip netns pids``), not the process group.
        """
        agent = self.agents.get(host)
        if agent is not None and agent.poll() is None:
            # not reaped yet, so its pid (the pgid) cannot have been reused
            os.killpg(agent.pid, signal.SIGKILL)
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def destroy(self) -> None:
        for host, ns in enumerate(self.hosts):
            if ns in self.created:
                self.kill_host(host)
        for agent in self.agents.values():
            try:
                agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs:
            log.close()
        # a namespace lives on while a process is in it: wait for the killed ones to go
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
            self.pids(h) for h in range(len(self.hosts)) if self.hosts[h] in self.created
        ):
            time.sleep(0.05)
        for ns in reversed(self.created):
            _ip("netns", "del", ns, check=False)
        self.created.clear()


@pytest.fixture
def topology():
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)
    topo = Topology(f"commlib-mh-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        topo.build()
        yield topo
    finally:
        topo.destroy()


def _logs(outdir: Path) -> str:
    parts = []
    for log in sorted(outdir.glob("torchrun-h*.log")):
        parts.append(f"--- {log.name} ---\n{log.read_text()[-4000:]}")
    return "\n".join(parts)


def _read(outdir: Path, rank: int) -> dict:
    path = outdir / f"rank{rank}.json"
    assert path.exists(), f"rank {rank} wrote no result\n{_logs(outdir)}"
    return json.loads(path.read_text())


@pytest.mark.timeout(150)
def test_collectives_across_hosts(topology, tmp_path):
    rdzv_id = uuid.uuid4().hex
    agents = [topology.torchrun(h, "conformance", tmp_path, rdzv_id) for h in range(HOSTS)]
    for host, agent in enumerate(agents):
        try:
            rc = agent.wait(timeout=START + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun on host {host} did not finish\n{_logs(tmp_path)}")
        assert rc == 0, f"torchrun on host {host} exited {rc}\n{_logs(tmp_path)}"
    results = [_read(tmp_path, r) for r in range(WORLD)]

    every = list(range(WORLD))
    digests = {r: digest(big_array(r)) for r in every}
    dataset = [{"item": k} for k in range(ITEMS)]
    seeds = {res["seed"] for res in results}
    assert len(seeds) == 1, seeds
    for r, res in enumerate(results):
        assert "error" not in res, res.get("error")
        # host 0 joins the rendezvous with the lower address, so it gets ranks 0 and 1
        assert (res["rank"], res["world"], res["host"]) == (r, WORLD, r // NPROC)
        assert (res["local_rank"], res["local_size"], res["backend"]) == (r % NPROC, NPROC, "gloo")
        assert res["all_reduce_sum"] == [10.0, 20.0]
        assert res["all_reduce_mean"] == [2.5, 5.0]
        assert res["all_reduce_mean_int"] == [1]  # mean of 0..3 is 1.5, truncated
        assert res["all_gather_ragged"] == [[10 * k for k in range(q + 1)] for q in every]
        assert res["all_gather_ragged_2d"] == [[[q + 1, 3], [float(q)]] for q in every]
        assert res["broadcast"] == [100.0, 101.0, 102.0, 103.0, 104.0]
        assert res["all_gather_object_small"] == [{"rank": q, "host": q // NPROC} for q in every]
        assert res["all_gather_object_big"] == [[q, digests[q]] for q in every]
        expect = [[q, digests[q] if q % 2 else None] for q in every]
        assert res["gather_object"] == (expect if r == WORLD - 1 else None)
        assert res["broadcast_object_list"] == [{"from": 1}, digests[1], "rank 1"]
        assert res["all_reduce_dict_sum"] == {
            "count": ["torch.int64", [10]],
            "loss": ["torch.float32", 6.0],
            "vec": ["torch.float32", [6.0, 6.0, 6.0]],
        }
        assert res["all_reduce_dict_mean"] == {
            "count": ["torch.int64", [2]],  # 10 / 4, truncated as the integer mean is
            "loss": ["torch.float32", 1.5],
            "vec": ["torch.float32", [1.5, 1.5, 1.5]],
        }
        for how in ("collect_cpu_tmpdir", "collect_cpu_default", "collect_gpu"):
            assert res[how] == (dataset if r == 0 else None), how
    # collect_results cleans up after itself, on the shared disk as well
    assert not list((tmp_path / "collect-shared").glob("part_*"))
    assert not (tmp_path / ".dist_test").exists()


def _wait_for(paths: list[Path], agents: list[subprocess.Popen], limit: float) -> None:
    deadline = time.monotonic() + limit
    while not all(p.exists() for p in paths):
        if any(a.poll() is not None for a in agents) or time.monotonic() > deadline:
            missing = [p.name for p in paths if not p.exists()]
            raise AssertionError(f"ranks never got into the loop: {missing}")
        time.sleep(0.05)


def _check_raised(
    s: dict, how: str, killed_at: float, outdir: Path, timeout: float = TIMEOUT
) -> None:
    """A survivor's error after host 1 was killed (``kill``) or cut off (``vanish``)."""
    detail = f"{s}\n{_logs(outdir)}"
    assert s["outcome"] in ("raised", "shrunk"), detail
    # every engine failure, tensor or object collective, comes out as a commlib error
    assert s["is_comm_error"], detail
    assert s["seconds"] <= timeout + SLACK, detail
    assert s["raised_at"] - killed_at <= timeout + SLACK, detail
    if s["is_timeout_error"]:
        # the dead host's ranks never reach the store, so they are named
        assert f"did not complete within {timeout:g}s" in s["message"], detail
        for r in range(NPROC, WORLD):
            assert f"rank {r}: did not arrive" in s["message"], detail
    if how == "vanish":
        # nobody told host 0: only the communicator's timeout ends the wait (its own,
        # or a host-0 peer's that closes the connection as it gives up)
        assert s["is_timeout_error"] or "closed by peer" in s["message"], detail
        assert s["seconds"] >= timeout - 1, detail


def _report(what: str, survivors: list[dict], killed_at: float) -> str:
    return ", ".join(
        f"rank {s['rank']}: {s.get('error_type')} in {s.get('collective')} after "
        f"{s.get('seconds', float('nan')):.2f}s ({s.get('raised_at', 0) - killed_at:.2f}s "
        f"after the {what})"
        for s in survivors
    )


@pytest.mark.timeout(150)
def test_surviving_host_fails_cleanly_when_the_other_vanishes(topology, tmp_path):
    # a kill of the other host is test_survivors_shrink_across_hosts' fault: the
    # survivors raise as here, then shrink; here they re-raise and torchrun must end
    rdzv_id = uuid.uuid4().hex
    agents = [
        topology.torchrun(h, "fault", tmp_path, rdzv_id, VANISH_TIMEOUT) for h in range(HOSTS)
    ]
    try:
        _wait_for([tmp_path / f"alive-{r}" for r in range(WORLD)], agents, START)
    except AssertionError as exc:
        pytest.fail(f"{exc}\n{_logs(tmp_path)}")

    # no FIN or RST will reach host 0: the link is gone before the processes are
    _ip("-n", topology.hosts[1], "link", "set", IFACE, "down")
    killed_at = time.time()
    topology.kill_host(1)

    # the survivors' torchrun must end by itself: its workers raise, it reports failure
    try:
        rc = agents[0].wait(timeout=EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        pytest.fail(f"host 0 still running {EXIT_WITHIN:g}s after the kill\n{_logs(tmp_path)}")
    survivors = [_read(tmp_path, r) for r in range(NPROC)]
    report = _report("cut", survivors, killed_at)
    print(f"\n[multihost] vanish: host 0 torchrun exit {rc}; {report}")
    for s in survivors:
        assert s["outcome"] == "raised", s
        _check_raised(s, "vanish", killed_at, tmp_path, VANISH_TIMEOUT)
    # the workers re-raised: torchrun reports the failure rather than success
    assert rc != 0, _logs(tmp_path)


@pytest.mark.timeout(150)
def test_survivors_shrink_across_hosts(topology, tmp_path):
    # host 1 is SIGKILLed (the kernel closes its sockets): host 0's ranks raise a
    # commlib error in time, as when it vanishes, then shrink to the two of them
    rdzv_id = uuid.uuid4().hex
    agents = [topology.torchrun(h, "shrink", tmp_path, rdzv_id) for h in range(HOSTS)]
    try:
        _wait_for([tmp_path / f"alive-{r}" for r in range(WORLD)], agents, START)
    except AssertionError as exc:
        pytest.fail(f"{exc}\n{_logs(tmp_path)}")
    killed_at = time.time()
    topology.kill_host(1)
    # the survivors go on, so host 0's torchrun does not end now: its agent waits at
    # the exit barrier for host 1's agent (minutes); the ranks' own files are the answer
    results = [tmp_path / f"rank{r}.json" for r in range(NPROC)]
    deadline = time.monotonic() + EXIT_WITHIN
    while not all(p.exists() for p in results) and time.monotonic() < deadline:
        if agents[0].poll() is not None:
            break
        time.sleep(0.1)
    survivors = [_read(tmp_path, r) for r in range(NPROC)]
    report = _report("kill", survivors, killed_at)
    shrinks = ", ".join(f"{s.get('shrink_seconds', float('nan')):.3f}s" for s in survivors)
    print(f"\n[multihost] kill: {report}; shrink {shrinks}")
    for new_rank, s in enumerate(survivors):
        detail = f"{s}\n{_logs(tmp_path)}"
        assert "error" not in s, detail
        _check_raised(s, "kill", killed_at, tmp_path)
        assert s["outcome"] == "shrunk" and s["checked"], detail
        got = (s["new_rank"], s["new_world"], s["world_ranks"])
        assert got == (new_rank, NPROC, [0, 1]), survivors
