"""What the dispatch kind times: per collective, torch's own call and commlib's.

Each case prepares, on a communicator over torch's fake process group
(:mod:`commlib.bench.fake_world`), the call a plain ``torch.distributed``
program makes and the same call through the
:class:`~commlib.Communicator` method, on tensors of :data:`ELEMENTS` float32
elements per rank, as in :mod:`commlib.bench.cases`: where commlib returns new
tensors (``all_gather``, ``gather``) the torch call allocates its outputs
too; where both write into a caller's buffer, both get one made beforehand.
This process is rank 0 of the fake world: the root of the rooted collectives,
and the peer of point to point is rank 1.

The cases are chosen on the command line with ``--ops dispatch`` (every one)
or by name, ``all_reduce[dispatch]``; a collective's name alone
(``--ops all_reduce``) keeps meaning the case that runs across ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from commlib import _torch_facts as torch_facts
from commlib.communicator import Communicator

#: the kind's name in ``--ops``, and the suffix of its case names
KIND = "dispatch"
#: float32 elements each rank contributes: small, so that dispatch is all there is
ELEMENTS = 4
#: commlib's sides, each timed against torch's own call (see :mod:`commlib.bench.dispatch`)
VARIANTS = ("unchecked", "observer", "recorder")
LABELS = {
    "unchecked": "commlib unchecked",
    "observer": "one observer",
    "recorder": "flight recorder",
}
#: the call path's targets (issue 28): commlib's time over torch's own call, at most
TARGETS = {"unchecked": 1.0, "observer": 1.3, "recorder": 1.5}

# torch 2.13 renamed the flat collectives and warns on every call of the old names
_all_gather_single = torch_facts.all_gather_single
_reduce_scatter_single = torch_facts.reduce_scatter_single

Calls = dict[str, Callable[[], Any]]


@dataclass(frozen=True)
class DispatchCase:
    """One collective of the dispatch kind; ``prepare`` makes its two calls on a communicator.

    ``prepare(comm)`` returns ``{"torch": call, "commlib": call}``, each a
    no-argument call. A case needs at least ``min_world`` ranks (point to
    point needs a peer) and is left out of smaller worlds.
    """

    op: str
    prepare: Callable[[Communicator], Calls]
    min_world: int = 1

    @property
    def name(self) -> str:
        """The case's name on the command line: ``all_reduce[dispatch]``."""
        return f"{self.op}[{KIND}]"


def _ones(count: int, device: torch.device) -> torch.Tensor:
    return torch.ones(count, dtype=torch.float32, device=device)


def _empty(count: int, device: torch.device) -> torch.Tensor:
    return torch.empty(count, dtype=torch.float32, device=device)


def _all_reduce(comm: Communicator) -> Calls:
    x, pg = _ones(ELEMENTS, comm.device), comm.group
    return {
        "torch": lambda: dist.all_reduce(x, group=pg),
        "commlib": lambda: comm.all_reduce(x),
    }


def _broadcast(comm: Communicator) -> Calls:
    x, pg, src = _ones(ELEMENTS, comm.device), comm.group, comm.ranks[0]
    return {
        "torch": lambda: dist.broadcast(x, src=src, group=pg),
        "commlib": lambda: comm.broadcast(x, 0),
    }


def _all_gather_into_tensor(comm: Communicator) -> Calls:
    dev, pg = comm.device, comm.group
    x, out = _ones(ELEMENTS, dev), _empty(comm.world_size * ELEMENTS, dev)
    return {
        "torch": lambda: _all_gather_single(out, x, group=pg),
        "commlib": lambda: comm.all_gather_into_tensor(out, x),
    }


def _reduce_scatter(comm: Communicator) -> Calls:
    dev, pg = comm.device, comm.group
    x, out = _ones(comm.world_size * ELEMENTS, dev), _empty(ELEMENTS, dev)
    return {
        "torch": lambda: _reduce_scatter_single(out, x, group=pg),
        "commlib": lambda: comm.reduce_scatter(out, x),
    }


def _all_gather(comm: Communicator) -> Calls:
    n, x, pg = comm.world_size, _ones(ELEMENTS, comm.device), comm.group

    def theirs() -> list[torch.Tensor]:
        out = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(out, x, group=pg)
        return out

    return {"torch": theirs, "commlib": lambda: comm.all_gather(x)}


def _reduce(comm: Communicator) -> Calls:
    x, pg, dst = _ones(ELEMENTS, comm.device), comm.group, comm.ranks[0]
    return {
        "torch": lambda: dist.reduce(x, dst=dst, group=pg),
        "commlib": lambda: comm.reduce(x, 0),
    }


def _gather(comm: Communicator) -> Calls:
    n, x, pg, dst = comm.world_size, _ones(ELEMENTS, comm.device), comm.group, comm.ranks[0]

    def theirs() -> list[torch.Tensor]:
        out = [torch.empty_like(x) for _ in range(n)]  # this rank is dst
        dist.gather(x, out, dst=dst, group=pg)
        return out

    return {"torch": theirs, "commlib": lambda: comm.gather(x, 0)}


def _scatter(comm: Communicator) -> Calls:
    dev, pg, src = comm.device, comm.group, comm.ranks[0]
    parts = [_ones(ELEMENTS, dev) for _ in range(comm.world_size)]  # this rank is src
    out = _empty(ELEMENTS, dev)
    return {
        "torch": lambda: dist.scatter(out, parts, src=src, group=pg),
        "commlib": lambda: comm.scatter(out, parts, 0),
    }


def _all_to_all_single(comm: Communicator) -> Calls:
    dev, pg, n = comm.device, comm.group, comm.world_size
    x, out = _ones(n * ELEMENTS, dev), _empty(n * ELEMENTS, dev)
    return {
        "torch": lambda: dist.all_to_all_single(out, x, group=pg),
        "commlib": lambda: comm.all_to_all_single(out, x),
    }


def _all_to_all(comm: Communicator) -> Calls:
    dev, pg, n = comm.device, comm.group, comm.world_size
    ins = [_ones(ELEMENTS, dev) for _ in range(n)]
    outs = [_empty(ELEMENTS, dev) for _ in range(n)]
    return {
        "torch": lambda: dist.all_to_all(outs, ins, group=pg),
        "commlib": lambda: comm.all_to_all(outs, ins),
    }


def _barrier(comm: Communicator) -> Calls:
    pg = comm.group
    return {"torch": lambda: dist.barrier(group=pg), "commlib": lambda: comm.barrier()}


def _send(comm: Communicator) -> Calls:
    x, pg, peer = _ones(ELEMENTS, comm.device), comm.group, comm.ranks[1]
    return {
        "torch": lambda: dist.send(x, peer, group=pg),
        "commlib": lambda: comm.send(x, 1),
    }


def _recv(comm: Communicator) -> Calls:
    x, pg, peer = _empty(ELEMENTS, comm.device), comm.group, comm.ranks[1]
    return {
        "torch": lambda: dist.recv(x, peer, group=pg),
        "commlib": lambda: comm.recv(x, 1),
    }


CASES: list[DispatchCase] = [
    DispatchCase("all_reduce", _all_reduce),
    DispatchCase("broadcast", _broadcast),
    DispatchCase("all_gather_into_tensor", _all_gather_into_tensor),
    DispatchCase("reduce_scatter", _reduce_scatter),
    DispatchCase("all_gather", _all_gather),
    DispatchCase("reduce", _reduce),
    DispatchCase("gather", _gather),
    DispatchCase("scatter", _scatter),
    DispatchCase("all_to_all_single", _all_to_all_single),
    DispatchCase("all_to_all", _all_to_all),
    DispatchCase("barrier", _barrier),
    DispatchCase("send", _send, min_world=2),
    DispatchCase("recv", _recv, min_world=2),
]


def is_dispatch_token(token: str) -> bool:
    """Whether an ``--ops`` token names the dispatch kind or one of its cases.

    Examples:
        >>> is_dispatch_token("dispatch"), is_dispatch_token("all_reduce[dispatch]")
        (True, True)
        >>> is_dispatch_token("all_reduce")
        False
    """
    return token == KIND or token.endswith(f"[{KIND}]")


def select_dispatch(spec: str | Sequence[str] | None) -> list[DispatchCase]:
    """The dispatch cases ``spec`` names, in the standard order; none unless it names them.

    ``spec`` is ``--ops``: a comma-separated list (or a list) in which
    ``dispatch`` is every case of the kind and ``all_reduce[dispatch]`` one.
    The default (``None``, ``"all"``) is the cases across ranks, not these.

    Examples:
        >>> [c.op for c in select_dispatch("all_reduce[dispatch],broadcast[dispatch]")]
        ['all_reduce', 'broadcast']
        >>> len(select_dispatch("dispatch")) == len(CASES), select_dispatch(None)
        (True, [])
        >>> select_dispatch("nope[dispatch]")
        Traceback (most recent call last):
        ...
        ValueError: unknown --ops ['nope[dispatch]']; the dispatch cases are ...
    """
    if spec is None:
        return []
    tokens = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec)]
    wanted = {t for t in tokens if is_dispatch_token(t)}
    if KIND in wanted:
        return list(CASES)
    unknown = sorted(wanted - {c.name for c in CASES})
    if unknown:
        raise ValueError(
            f"unknown --ops {unknown}; the dispatch cases are {[c.name for c in CASES]} "
            f"(or {KIND!r} for all of them)"
        )
    return [c for c in CASES if c.name in wanted]
