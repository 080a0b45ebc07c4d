"""The agreed NaN/Inf check before a reduction (``check_finite``, ``COMMLIB_CHECK_FINITE``).

Before a reduction spreads a NaN or an Inf from one rank to all, every rank
says whether its own tensor is finite, and every rank raises the same
:class:`~commlib.errors.NonFiniteError` naming the ranks whose tensors are
not and the program's line that called the collective. Where the argument
check runs (:mod:`commlib._guard`), the flag rides in its round: it is part of
what each rank describes, so ranks that differ only in it take the check's
mismatch path, and ranks that all carry it know it from their own. Elsewhere
it takes one check-sized round of its own (:func:`commlib._check_round.agree`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from commlib._check_round import agree
from commlib.errors import NonFiniteError, RemoteArgumentError
from commlib.observe.call_site import call_site

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from commlib._engine import Engine
    from commlib._guard import Guard
    from commlib.serialization import Serializer
    from commlib.types import Timeout

ENV = "COMMLIB_CHECK_FINITE"
#: what a rank whose tensor is not finite adds to its description in the check
MARK = ", not finite"


def from_env() -> bool:
    """Whether ``COMMLIB_CHECK_FINITE`` asks for the check (``1``, ``true``, ``yes``, ``on``).

    Examples:
        >>> from_env()
        False
    """
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_finite(tensor: torch.Tensor) -> bool:
    """Whether every element of ``tensor`` is finite (integers always are).

    Examples:
        >>> is_finite(torch.ones(2)), is_finite(torch.tensor([1.0, float("nan")]))
        (True, False)
    """
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return True
    return bool(torch.isfinite(tensor).all())


def flag(on: bool, tensor: torch.Tensor) -> bool | None:
    """Whether ``tensor`` is finite where the check is ``on``; ``None`` where it is off.

    Examples:
        >>> flag(True, torch.tensor([float("inf")])), flag(False, torch.ones(1))
        (False, None)
    """
    return is_finite(tensor) if on else None


def checked(
    guard: Guard,
    engine: Engine,
    what: str,
    describe: Callable[[], str],
    data: torch.Tensor,
    timeout: Timeout,
    finite: bool | None,
    key: Hashable,
) -> list[torch.Tensor] | None:
    """The argument check of ``what``, the NaN/Inf flag riding in it (``finite``: :func:`flag`).

    ``key`` names what ``describe`` formats (``Guard.check``'s); the flag joins it.

    Examples:
        >>> guard = commlib._guard.Guard()  # doctest: +SKIP
        >>> checked(guard, engine, "all_reduce", lambda: "op=sum", x,  # doctest: +SKIP
        ...         None, None, ("sum",))
    """
    if finite is None:
        return guard.check(engine, what, describe, data, timeout, key=key)
    try:
        parts = guard.check(
            engine,
            what,
            lambda: describe() + ("" if finite else MARK),
            data,
            timeout,
            key=(key, finite),
        )
    except RemoteArgumentError as exc:
        raise from_mismatch(what, exc) from None
    raise_if_every_rank(what, finite, engine.world_size)
    return parts


def _where() -> str:
    site = call_site()
    return f" at {site.short()}" if site is not None else ""


def raise_if_every_rank(what: str, finite: bool, world: int) -> None:
    """After a check that agreed: this rank's tensor is not finite, so no rank's is.

    Examples:
        >>> raise_if_every_rank("all_reduce", True, 2)   # finite: nothing to say
    """
    if not finite:
        raise NonFiniteError(what, list(range(world)), _where())


def from_mismatch(what: str, error: RemoteArgumentError) -> BaseException:
    """The check's mismatch, as the NaN error when the ranks differ only in the flag.

    Otherwise ``error`` itself: ranks whose arguments disagree are told so first.
    """
    texts = error.failures
    if len({t.replace(MARK, "") for t in texts.values()}) != 1:
        return error
    return NonFiniteError(what, sorted(r for r, t in texts.items() if MARK in t), _where())


def agree_finite(
    engine: Engine, what: str, finite: bool, serializer: Serializer, slot_size: int
) -> None:
    """The flag's own round, where no argument check runs: every rank raises alike.

    Examples:
        >>> agree_finite(engine, "all_reduce", True, serializer, 4096)
    """
    if engine.world_size == 1:  # nobody to agree with
        raise_if_every_rank(what, finite, 1)
        return
    try:
        agree(engine, what, "finite check" + ("" if finite else MARK), serializer, slot_size)
    except RemoteArgumentError as exc:
        raise from_mismatch(what, exc) from None
    raise_if_every_rank(what, finite, engine.world_size)
