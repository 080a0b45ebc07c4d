"""``Backend``: the contract a backend plugin implements.

One abstract class with working defaults that call ``torch.distributed``; a
concrete backend states its name, the torch.distributed backend it drives and
its device, and overrides only what differs (httpx's transports are the model).
Conventions every method may rely on, because the :class:`~commlib.Communicator`
guarantees them before it calls in:

* arguments are validated: known op, tensors of the right kind, ranks in range;
* tensors are contiguous and on :meth:`Backend.device`; ranks are *within* ``group``;
* ``group`` is a ``torch.distributed.ProcessGroup`` the caller is in (``None``
  only for backends without a process group, such as ``single``);
* collectives are called with ``async_op=True`` and return a
  :class:`~commlib.types.Work` (``wait(timeout)``, ``is_completed()``), or
  ``None`` when they have finished already (the types: :mod:`commlib.types`).

The minimum a plugin implements:

* **an engine that torch.distributed drives** (gloo, nccl, a vendor's
  ``torch.distributed`` backend): three class attributes, ``name``,
  ``torch_backend`` and ``device_type``; every method has a working default.
  Derive from ``commlib_backends.engine_gaps.EngineGaps`` instead of
  ``Backend`` when the engine lacks dtypes or reductions (gloo has no int16,
  uint16/32/64 or float8 reductions): it fills them, and the conformance kit
  passes.
* **another engine** (no ``torch.distributed`` process group): ``name`` and
  ``device_type``, and the 21 methods whose default calls
  ``torch.distributed``: ``unavailable_reason``, ``init_process_group``,
  ``new_group``, ``rank``, ``world_size``, ``torch_reduce_op``, ``all_reduce``,
  ``all_gather``, ``all_gather_into_tensor``, ``gather``, ``broadcast``,
  ``reduce_scatter``, ``reduce``, ``scatter``, ``all_to_all``,
  ``all_to_all_single``, ``barrier``, ``send``, ``recv``,
  ``batch_isend_irecv`` and ``shrink_group`` (only for fault-tolerant
  shrinking); ``to_device`` too when its tensors live elsewhere. The
  ``single`` backend (``commlib_backends/single.py``) is such an engine and
  overrides all but ``shrink_group``.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.distributed as dist

from commlib import _torch_facts as torch_facts
from commlib._torch_groups import build_group
from commlib._torch_lanes import process_group_lane
from commlib.serialization import Serializer, default_serializer
from commlib.types import DirectCall as DirectCall  # the contract's type, named here too
from commlib.types import EngineOp, Group, P2PRequest, Work
from commlib.works import ThenWork as ThenWork  # plugins imported it from here
from commlib.works import WorkList, global_rank

# torch.device is immutable: one per type serves every call
_device = functools.cache(torch.device)


class Backend:
    """Base class of every backend plugin.

    A subclass sets the class attributes below (``name``, ``torch_backend`` and
    ``device_type`` are required; each says what commlib does with it) and
    overrides the methods its engine does differently.

    Examples:
        >>> class LoggingGloo(Backend):
        ...     name = "logging-gloo"
        ...     torch_backend = "gloo"
        ...     def all_reduce(self, tensor, op, group, async_op=False):
        ...         print("all_reduce", tensor.shape)
        ...         return super().all_reduce(tensor, op, group, async_op)
    """

    name: ClassVar[str] = ""
    """Required. What users pass (``init_dist(backend=name)``); unique among the registered
    plugins.
    """
    torch_backend: str | None = None  # an instance may serve a multi-device group
    """Required for a ``torch.distributed`` engine: the name of the torch.distributed backend it
    drives, or a multi-device spec (``"DEVICE:BACKEND,..."``); ``None`` for an engine without
    process groups.
    """
    device_type: ClassVar[str] = "cpu"
    """Required. The device type its collectives want tensors on (a ``torch.device`` type)."""
    description: ClassVar[str] = ""
    """One line for ``commlib info``."""
    native_avg: ClassVar[bool] = False
    """Whether the engine reduces with ``avg`` itself; ``False``: commlib computes a mean as sum,
    then divide.
    """
    large_payload_transport: ClassVar[Literal["collective", "p2p"]] = "collective"
    """How object collectives move payloads past the first round: ``"collective"`` (padded
    all_gather / gather / broadcast) or ``"p2p"`` (send/recv between the ranks that need them).
    """
    mismatch_aborts: ClassVar[bool] = True
    """The engine ends the process, beyond any caller's reach, when ranks call the same
    collective with different sizes (gloo throws on its own I/O thread); commlib then checks
    the arguments of the tensor collectives by default (see
    :attr:`commlib.Communicator.strict`). ``True`` unless a backend knows better: a check
    costs less than a lost job.
    """
    interruptible_wait: ClassVar[bool] = False
    """The ``Work`` of the engine's collectives only waits in ``wait(timeout)`` (when the timeout
    passes the operation goes on, nothing else changes), so commlib waits in slices and looks
    in between for a failure another rank announced: a rank waiting on a live peer that gave
    up learns it within a moment rather than at its own timeout. Point-to-point works (a
    :class:`WorkList`) are not sliced (gloo ends a receive whose wait timed out); see
    ``p2p_timeout_ends_group``.
    """
    p2p_timeout_ends_group: ClassVar[bool] = False
    """A point-to-point ``Work.wait(timeout)`` that times out ends every operation pending on the
    group, and with it any other thread's wait on them (gloo closes the group's connections:
    "Application timeout caused pair closure"). commlib relies on it to watch a point-to-point
    wait without a thread handoff: the caller waits on the work in its own thread, and a
    watcher thread that finds the group announced broken elsewhere ends that wait with a wait
    of a millisecond on the same work. ``False`` (not known to hold): a waiter thread waits on
    the work while the caller's thread watches, tens of microseconds a wait.
    """
    own_rendezvous: ClassVar[bool] = False
    """Whether the engine finds its ranks itself (MPI under ``mpiexec``): :func:`commlib.init_dist`
    then reads no rank, world size or address from the launcher's environment and
    :meth:`init_process_group` gets neither ``init_method`` nor ``rank``.
    """
    completed_by_check: ClassVar[frozenset[str]] = frozenset()
    """The collectives whose small results the argument check may compute from its own round (it
    gathers every rank's data anyway) instead of calling this backend's method, one round
    instead of two. A subclass that overrides one of these methods drops it from the set,
    unless it sets ``completed_by_check`` itself: an overridden collective is always called.
    """
    shares_host_rounds: ClassVar[bool] = False
    """On one machine, the protocols' slot rounds (:meth:`all_gather_slots`) may go through
    shared memory instead of the engine (:mod:`commlib._shared_rows`): gloo's sockets."""
    completed_by_check_bytes: ClassVar[int | None] = None
    """Up to how many bytes of a rank's data complete in the check's round (``None``: as many as
    the slot learns): for an engine whose own collective moves larger data with fewer copies
    than the round and the local step after it (MPI's shared memory).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "completed_by_check" not in cls.__dict__:
            cls.completed_by_check = frozenset(
                name for name in cls.completed_by_check if name not in cls.__dict__
            )

    # -- identity and availability -------------------------------------------------
    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here, or ``None`` when it can.

        Returns:
            A sentence for the user (shown by ``commlib info`` and in
            :class:`~commlib.errors.BackendUnavailableError`), or ``None``.
            The default checks that torch has ``torch.distributed`` and
            :attr:`torch_backend`; a plugin adds its own needs (a driver, a device).

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").unavailable_reason() is None
            True
            >>> commlib.plugins.resolve_backend("nccl").unavailable_reason()  # doctest: +SKIP
            'torch was built without NCCL'
        """
        if not dist.is_available():
            return "torch was built without torch.distributed"
        if self.torch_backend and not dist.is_backend_available(self.torch_backend):
            return f"torch was built without {self.torch_backend}"
        return None

    def is_available(self) -> bool:
        """Whether this backend can run here.

        Returns:
            ``True`` when :meth:`unavailable_reason` is ``None``; a plugin
            overrides :meth:`unavailable_reason`, not this.

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").is_available()
            True
        """
        return self.unavailable_reason() is None

    def launch_command(self, world_size: int) -> list[str] | None:
        """The command that starts ``world_size`` ranks of this engine, or ``None``.

        Tools that start ranks (the test harness, the conformance kit,
        ``commlib bench``) put ``python -m ...`` after it; ``None``, the
        default, lets them start the ranks themselves (a process each,
        joined through a store). An engine whose ranks only a launcher of its
        own can start (MPI's ``mpiexec``) returns that launcher's command.

        Args:
            world_size: how many ranks to start.

        Returns:
            The command's words (a program and its options), or ``None``.

        Raises:
            FileNotFoundError: the launcher is not installed.

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").launch_command(2) is None
            True
        """
        return None

    def default_priority(self) -> int | None:
        """How strongly this backend claims the machine when the user names none.

        :func:`commlib.plugins.backend_for_group` picks the available backend
        with the highest number; ``None`` never serves by default. The
        default: 0 for a backend that drives a torch backend (a CPU one
        such as gloo is the fallback), ``None`` for ``single``. Accelerator
        backends answer higher while their device is visible.

        Returns:
            The priority (higher wins), or ``None`` to serve only when named.

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").default_priority()
            0
        """
        return 0 if self.torch_backend else None

    # -- devices -------------------------------------------------------------------
    def device(self) -> torch.device:
        """The device this backend's collectives need, for the current process.

        Returns:
            The device its tensor arguments are on (the core moves them there
            with :meth:`to_device`): ``device_type`` with this process's index
            for an accelerator.

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").device()
            device(type='cpu')
        """
        return _device(self.device_type)

    def setup_device(self, local_rank: int) -> None:
        """Select this process's device before the process group starts.

        Called by :func:`commlib.init_dist`. Accelerator backends set the
        current device from ``local_rank`` unless the user already chose one.
        The default (CPU) does nothing.

        Args:
            local_rank: this process's rank on its machine (``LOCAL_RANK``).

        Returns:
            Nothing.
        """

    def current_device(self) -> torch.device:
        """This process's current device of :attr:`device_type` (where received tensors land).

        Unlike :meth:`device`, it is the device type's own current device even
        where the backend's buffers live elsewhere (a multi-device group).

        Returns:
            A ``torch.device`` of :attr:`device_type`.

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").current_device()
            device(type='cpu')
        """
        return torch.device(self.device_type)

    def synchronize(self) -> None:
        """Wait for the work queued on this process's device (timing, benchmarks).

        Nothing to wait for on the CPU, the default.

        Returns:
            Nothing; it returns once the device's queued work is done.

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").synchronize()
        """

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` on :meth:`device` (the same object when it is there).

        Args:
            tensor: any tensor, on any device.

        Returns:
            ``tensor`` itself when already on :meth:`device`, else a copy there.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> x = torch.ones(2)
            >>> gloo.to_device(x) is x                 # already there
            True
            >>> gloo.to_device(torch.ones(2, device="cuda")).device  # doctest: +SKIP
            device(type='cpu')
        """
        dev = self.device()
        if tensor.device == dev or (dev.index is None and tensor.device.type == dev.type):
            return tensor
        return tensor.to(dev)

    def for_group(self, torch_backend: str) -> Backend:
        """The instance that serves a group started with ``torch_backend``.

        ``torch_backend`` may name several devices (``"cpu:gloo,cuda:nccl"``);
        a plugin can return a variant that handles such a group differently.
        The default serves every group the same way.

        Args:
            torch_backend: the group's ``torch.distributed`` backend string.

        Returns:
            A :class:`Backend` (``self`` by default).

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> gloo.for_group("gloo") is gloo
            True
        """
        return self

    # -- object serialization ------------------------------------------------------
    def serializer(self) -> Serializer:
        """The object-serialization strategy this backend uses by default.

        Returns:
            A :class:`~commlib.serialization.Serializer`; the object
            collectives use it unless the caller passes another.

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").serializer()
            <OutOfBandSerializer 'pickle5'>
        """
        return default_serializer()

    # -- process groups ------------------------------------------------------------
    def init_process_group(self, **kwargs: Any) -> None:
        """Start the default process group for this backend (``env://`` etc.).

        Args:
            **kwargs: what ``torch.distributed.init_process_group`` takes
                (``init_method``, ``rank``, ``world_size``, ``timeout``, ...),
                already chosen by :func:`commlib.init_dist`; the default adds
                ``backend=``:attr:`torch_backend` unless ``backend`` is given
                (``init_dist(serve_torch=True)`` gives ``"commlib-NAME"``: the
                world a torch backend commlib serves over this plugin).

        Returns:
            Nothing; the default group exists afterwards.

        Examples:
            >>> backend = commlib.plugins.resolve_backend("gloo")
            >>> backend.init_process_group(init_method="env://")  # torchrun  # doctest: +SKIP
        """
        kwargs.setdefault("backend", self.torch_backend)
        dist.init_process_group(**kwargs)

    def new_group(
        self,
        ranks: Sequence[int],
        timeout: datetime.timedelta | None = None,
        *,
        members_only: bool = False,
        keep_order: bool = False,
    ) -> Group:
        """Create a subgroup of the world; every world rank must call it.

        Args:
            ranks: world ranks of the new group, non-empty, in range and
                without duplicates, the same list on every rank (the core
                checked all that and agreed on it before the call).
            timeout: the new group's operation timeout; ``None``: the world's.
            members_only: only the ranks in ``ranks`` call it (torch's
                ``use_local_synchronization=True``): ``Communicator.split``
                and ``new_group(..., use_local_synchronization=True)``. The
                core passes it (and ``keep_order``) only when true, so a
                plugin whose override lacks them serves every other call.
            keep_order: the new group numbers its ranks in the order of
                ``ranks`` (torch's ``sort_ranks=False``), not ascending.

        Returns:
            The new group (what the collectives receive as ``group``); on a
            rank outside ``ranks``, whatever the engine returns for a
            non-member (torch: ``GroupMember.NON_GROUP_MEMBER``).

        Examples:
            >>> backend = commlib.plugins.resolve_backend("gloo")
            >>> pair = backend.new_group([0, 1])  # every rank of 2 or more  # doctest: +SKIP
        """
        if members_only or keep_order:
            return dist.new_group(
                list(ranks),
                timeout=timeout,
                backend=self.torch_backend,
                use_local_synchronization=members_only,
                sort_ranks=not keep_order,
            )
        return dist.new_group(list(ranks), timeout=timeout, backend=self.torch_backend)

    def rank(self, group: Group) -> int:
        """This process's rank in ``group`` (-1 when it is not a member).

        Args:
            group: as for :meth:`all_reduce`.

        Returns:
            The rank, ``0`` to ``world_size - 1``, or -1.
        """
        return dist.get_rank(group)

    def world_size(self, group: Group) -> int:
        """The number of ranks in ``group``.

        Args:
            group: as for :meth:`all_reduce`.

        Returns:
            The group's size, at least 1.
        """
        return dist.get_world_size(group)

    def torch_reduce_op(self, op: EngineOp) -> Any:
        """Map one of commlib's op names (``sum``, ``avg``, ...) to the engine's op.

        Args:
            op: a :data:`~commlib.types.EngineOp` name.

        Returns:
            What the engine's calls take as their reduction (the defaults: a
            ``torch.distributed.ReduceOp``).
        """
        return getattr(dist.ReduceOp, op.upper())  # commlib's names are torch's, lower case

    def direct_call(self, collective: str, group: Group, **key: Any) -> DirectCall | None:
        """The engine call that serves ``collective`` for ``key``, decided once per group.

        The engine issues it itself, past the collective's method, on every
        call that matches ``key`` (the call's other arguments are tensors,
        checked by the core as for the method). The default, for an engine
        torch.distributed drives: the ProcessGroup's own method that the
        default method's torch.distributed function calls, with its options
        built once (:mod:`commlib._torch_lanes`), so a plugin that keeps the
        default methods gets their lanes; ``None`` for a group that is not
        a ``ProcessGroup`` (every call through the method). The engine asks
        only where the class that wrote ``direct_call`` derives from the one
        that wrote the collective's method: a plugin that overrides
        ``all_reduce`` has its ``all_reduce`` called, unless it writes a
        ``direct_call`` too (then it answers for both; return ``None`` for
        what its method does differently).

        Keys, by collective: ``all_reduce`` ``op`` (an
        :data:`~commlib.types.EngineOp`) and ``dtype``; ``broadcast``
        ``src`` and ``dtype``; ``reduce`` ``op``, ``dst`` and ``dtype``;
        ``all_gather_into_tensor`` and ``all_to_all_single`` (equal splits)
        ``dtype``; ``reduce_scatter`` ``op`` and ``dtype``; ``scatter``
        ``src`` and ``dtype``; ``all_to_all`` (lists of tensors of one
        shape) ``dtype``; ``all_gather_slots`` ``slot_bytes`` (one row's
        size; the rows are uint8) and optionally ``apart`` (whether the
        rows go to their ranks: :meth:`sends_slot_rows_apart`); ``send`` and
        ``recv`` ``dtype``; ``barrier`` none. Return ``None`` for a
        collective or key the plugin does not serve so.

        Examples:
            >>> gloo = commlib.plugins.resolve_backend("gloo")
            >>> lane = gloo.direct_call("all_reduce", group, op="sum", dtype=torch.float32)
            ... # doctest: +SKIP
        """
        return process_group_lane(self, collective, group, key, Backend)

    # -- tensor collectives --------------------------------------------------------
    def all_reduce(
        self, tensor: torch.Tensor, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        """Reduce ``tensor`` in place across ``group`` with ``op``.

        Args:
            tensor: contiguous, on :meth:`device`; the core has checked it matches
                on every rank.
            op: one of ``sum product min max band bor bxor`` (``avg`` only when
                :attr:`native_avg`); valid for the dtype.
            group: the ``torch.distributed`` process group the caller belongs to
                (``None`` only for an engine without process groups, such as ``single``).
            async_op: ``True`` from the Communicator: start the operation and
                return its work handle.
        Returns:
            A :class:`~commlib.types.Work` when ``async_op`` (``wait`` then makes the
            result visible), or ``None`` when the operation has already finished.
        """
        return dist.all_reduce(tensor, self.torch_reduce_op(op), group=group, async_op=async_op)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Fill ``tensor_list[i]`` with rank ``i``'s ``tensor`` (equal shapes).

        Args:
            tensor_list: ``world_size`` outputs shaped and typed like ``tensor``,
                on :meth:`device`.
            tensor: contiguous, on :meth:`device`; the core has checked it matches
                on every rank.
            group: the ``torch.distributed`` process group the caller belongs to
                (``None`` only for an engine without process groups, such as ``single``).
            async_op: ``True`` from the Communicator: start the operation and
                return its work handle.
        Returns:
            A :class:`~commlib.types.Work` when ``async_op`` (``wait`` then makes the
            result visible), or ``None`` when the operation has already finished.
        """
        return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, group: Group, async_op: bool = False
    ) -> Work | None:
        """Concatenate every rank's ``tensor`` along dim 0 into ``output``.

        Args:
            output: ``world_size`` times ``tensor``'s rows, same dtype, on :meth:`device`.
            tensor: contiguous, on :meth:`device`; the core has checked it matches
                on every rank.
            group: the ``torch.distributed`` process group the caller belongs to
                (``None`` only for an engine without process groups, such as ``single``).
            async_op: ``True`` from the Communicator: start the operation and
                return its work handle.
        Returns:
            A :class:`~commlib.types.Work` when ``async_op`` (``wait`` then makes the
            result visible), or ``None`` when the operation has already finished.
        """
        return torch_facts.all_gather_single(output, tensor, group=group, async_op=async_op)

    def all_gather_slots(
        self, output: torch.Tensor, slots: torch.Tensor, group: Group, async_op: bool = False
    ) -> Work | None:
        """Every rank's slot into ``output``: row ``r`` (of ``world_size``) from rank ``r``.

        ``slots`` is ``(k, n)`` bytes: this rank's slot ``n`` bytes long,
        repeated ``k`` times, where ``k`` is ``world_size`` (small slots) or 1.
        The first rounds of commlib's protocols (the argument check,
        ``all_gather``'s shapes) keep such a buffer from call to call and
        write small slots into every row, so that an engine that gathers small
        tensors fastest with its all_to_all sends them as they are, without
        building an input. The default gathers the first row.

        Args:
            output: ``(world_size, n)`` uint8 on :meth:`device`, written in place.
            slots: ``(k, n)`` uint8 on :meth:`device`, as above.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.

        Returns:
            As for :meth:`all_reduce`.
        """
        return self.all_gather_into_tensor(output, slots[0], group, async_op)

    def sends_slot_rows_apart(self, world: int, slot_bytes: int) -> bool:
        """Whether :meth:`all_gather_slots` of ``world`` rows sends row ``j`` to rank ``j``.

        Where it does (an engine that gathers small slots by its all_to_all,
        sending the rows as they are), a protocol may write a different slot
        for each rank: the argument check then carries a scatter's pieces
        and an all_to_all_single's chunks in its round, each to the rank it
        is for. Every rank must answer alike for the same arguments. The
        default gathers the first row: ``False``.

        Args:
            world: the group's size, the rows written.
            slot_bytes: one row's size.

        Returns:
            Whether each rank receives, from every rank, the row with its own index.

        Examples:
            >>> commlib.plugins.resolve_backend("single").sends_slot_rows_apart(2, 4096)
            False
        """
        return False

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None,
        dst: int,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Collect every rank's ``tensor`` into ``gather_list`` on ``dst``.

        Args:
            tensor: contiguous, on :meth:`device`; the core has checked it matches
                on every rank.
            gather_list: on ``dst``, ``world_size`` outputs like ``tensor``;
                ``None`` on every other rank.
            dst: the receiving rank, within ``group`` (not a global rank).
            group: the ``torch.distributed`` process group the caller belongs to
                (``None`` only for an engine without process groups, such as ``single``).
            async_op: ``True`` from the Communicator: start the operation and
                return its work handle.
        Returns:
            A :class:`~commlib.types.Work` when ``async_op`` (``wait`` then makes the
            result visible), or ``None`` when the operation has already finished.
        """
        return dist.gather(
            tensor, gather_list, dst=global_rank(group, dst), group=group, async_op=async_op
        )

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Group, async_op: bool = False
    ) -> Work | None:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank.

        Args:
            tensor: ``src``'s data on ``src``; on the others, a buffer of the same
                shape and dtype that receives it; on :meth:`device`.
            src: the sending rank, within ``group``.
            group: the ``torch.distributed`` process group the caller belongs to
                (``None`` only for an engine without process groups, such as ``single``).
            async_op: ``True`` from the Communicator: start the operation and
                return its work handle.
        Returns:
            A :class:`~commlib.types.Work` when ``async_op`` (``wait`` then makes the
            result visible), or ``None`` when the operation has already finished.
        """
        return dist.broadcast(tensor, src=global_rank(group, src), group=group, async_op=async_op)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: EngineOp,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Reduce ``input`` (world_size chunks along dim 0) and keep chunk ``rank``.

        Args:
            output: one chunk's shape, same dtype, on :meth:`device`.
            input: ``world_size`` chunks along dim 0, contiguous, on :meth:`device`.
            op: as for :meth:`all_reduce`.
            group: the ``torch.distributed`` process group the caller belongs to
                (``None`` only for an engine without process groups, such as ``single``).
            async_op: ``True`` from the Communicator: start the operation and
                return its work handle.
        Returns:
            A :class:`~commlib.types.Work` when ``async_op`` (``wait`` then makes the
            result visible), or ``None`` when the operation has already finished.
        """
        return torch_facts.reduce_scatter_single(
            output, input, op=self.torch_reduce_op(op), group=group, async_op=async_op
        )

    def reduce(
        self, tensor: torch.Tensor, dst: int, op: EngineOp, group: Group, async_op: bool = False
    ) -> Work | None:
        """Reduce ``tensor`` across ``group`` with ``op`` into ``tensor`` on ``dst``.

        On the other ranks the engine may use ``tensor`` as scratch space; the
        Communicator hands it a copy there.

        Args:
            tensor: contiguous, on :meth:`device`; the result on ``dst``.
            dst: the receiving rank, within ``group``.
            op: as for :meth:`all_reduce`.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.

        Returns:
            As for :meth:`all_reduce`: a :class:`~commlib.types.Work`, or ``None``
            when finished already.
        """
        # torch reduces complex tensors as pairs of reals in all_reduce, not in reduce
        wire = torch.view_as_real(tensor) if tensor.is_complex() else tensor
        return dist.reduce(
            wire,
            dst=global_rank(group, dst),
            op=self.torch_reduce_op(op),
            group=group,
            async_op=async_op,
        )

    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None,
        src: int,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Fill ``tensor`` on each rank ``i`` with ``src``'s ``scatter_list[i]``.

        Args:
            tensor: the receiving buffer, on :meth:`device`.
            scatter_list: on ``src``, ``world_size`` tensors like ``tensor``;
                ``None`` on every other rank.
            src: the sending rank, within ``group``.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.

        Returns:
            As for :meth:`all_reduce`: a :class:`~commlib.types.Work`, or ``None``
            when finished already.
        """
        return dist.scatter(
            tensor, scatter_list, src=global_rank(group, src), group=group, async_op=async_op
        )

    def all_to_all(
        self,
        output_list: list[torch.Tensor],
        input_list: list[torch.Tensor],
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Send ``input_list[i]`` to rank ``i``; receive rank ``i``'s into ``output_list[i]``.

        Args:
            output_list: ``world_size`` receiving buffers, on :meth:`device`.
            input_list: ``world_size`` tensors, contiguous, on :meth:`device`.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.

        Returns:
            As for :meth:`all_reduce`: a :class:`~commlib.types.Work`, or ``None``
            when finished already.
        """
        return dist.all_to_all(output_list, input_list, group=group, async_op=async_op)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Split ``input`` along dim 0 (``input_split_sizes`` rows to each rank, equal
        parts when ``None``) and concatenate what each rank sends here into ``output``.

        Args:
            output: the rows received from every rank, in rank order, on :meth:`device`.
            input: the rows to send, contiguous, on :meth:`device`.
            output_split_sizes: rows from each rank (one entry per rank, adding up
                to ``output``'s rows); ``None``: equal parts.
            input_split_sizes: rows to each rank, likewise; ``None``: equal parts.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.

        Returns:
            As for :meth:`all_reduce`: a :class:`~commlib.types.Work`, or ``None``
            when finished already.
        """
        return dist.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
        )

    def barrier(self, group: Group, timeout: datetime.timedelta | None = None) -> None:
        """Block until every rank of ``group`` has arrived.

        Args:
            group: as for :meth:`all_reduce`.
            timeout: how long to wait; ``None``: the group's timeout.

        Returns:
            Nothing; it returns once every rank arrived (no async form).
        """
        dist.barrier(group=group, timeout=timeout)

    # -- point to point ------------------------------------------------------------
    def send(
        self, tensor: torch.Tensor, dst: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        """Send ``tensor`` to rank ``dst`` of ``group``.

        Args:
            tensor: contiguous, on :meth:`device`.
            dst: the receiving rank, within ``group``, never this rank.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.
            tag: matches a send with its receive.

        Returns:
            As for :meth:`all_reduce`.
        """
        work = dist.isend(tensor, dst=global_rank(group, dst), group=group, tag=tag)
        return WorkList([work]).result(async_op)

    def recv(
        self, tensor: torch.Tensor, src: int, group: Group, async_op: bool = False, tag: int = 0
    ) -> Work | None:
        """Receive into ``tensor`` what rank ``src`` of ``group`` sends.

        Args:
            tensor: the receiving buffer, shaped and typed like the sent tensor,
                on :meth:`device`.
            src: the sending rank, within ``group``, never this rank.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.
            tag: matches a send with its receive.

        Returns:
            As for :meth:`all_reduce`.
        """
        work = dist.irecv(tensor, src=global_rank(group, src), group=group, tag=tag)
        return WorkList([work]).result(async_op)

    def batch_isend_irecv(
        self, requests: Sequence[P2PRequest], group: Group, async_op: bool = False
    ) -> Work | None:
        """Post every send and receive of ``requests`` at once; one work for all of them.

        The default posts them one by one, which engines with asynchronous
        point-to-point (gloo) complete in any order; an engine that deadlocks
        on unbatched two-way exchange (NCCL) posts them as one group.

        Args:
            requests: :class:`~commlib.types.P2PRequest` items (kind, tensor on
                :meth:`device`, peer within ``group`` and never this rank, tag).
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.

        Returns:
            As for :meth:`all_reduce`: a :class:`~commlib.types.Work`, or ``None``
            when finished already.
        """
        works = [
            (dist.isend if r.kind == "send" else dist.irecv)(
                r.tensor, global_rank(group, r.peer), group=group, tag=r.tag
            )
            for r in requests
        ]
        return WorkList(works).result(async_op)

    def exchange(
        self,
        sends: Sequence[tuple[torch.Tensor, int]],
        recvs: Sequence[tuple[torch.Tensor, int]],
        group: Group,
        async_op: bool = False,
    ) -> Work | None:
        """Point-to-point: send each ``(tensor, peer)`` and receive into each.

        With ``async_op`` it returns one :class:`WorkList` to ``wait(timeout)``
        on; otherwise it blocks until all complete. Both sides must agree on
        sizes; the object collectives guarantee that through their first round.
        The default is :meth:`batch_isend_irecv`, receives first.

        Args:
            sends: ``(tensor, peer)`` pairs, tensors on :meth:`device`, peers
                ranks of ``group`` other than this one.
            recvs: ``(buffer, peer)`` pairs, received into in place.
            group: as for :meth:`all_reduce`.
            async_op: as for :meth:`all_reduce`.

        Returns:
            As for :meth:`all_reduce`.
        """
        requests = [P2PRequest("recv", t, peer) for t, peer in recvs]
        requests += [P2PRequest("send", t, peer) for t, peer in sends]
        return self.batch_isend_irecv(requests, group, async_op)

    # -- failures and recovery -----------------------------------------------------
    def is_timeout(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by this backend's engine, says an operation ran out of time.

        Asked only on the failure path, and only where the exception's type
        does not already tell (commlib reads torch's ``DistError`` family and
        ``TimeoutError`` by type first, see :mod:`commlib._error_map`). A call
        that failed after waiting its whole timeout counts as timed out
        whatever this says. The default reads the words engines commonly use
        ("timed out", "timeout"); a backend whose engine words it otherwise
        overrides this, so the engine's wording lives in its backend only.

        Args:
            exc: what the engine raised (a ``RuntimeError`` or a subclass).

        Returns:
            ``True`` for a timeout (commlib raises
            :class:`~commlib.errors.CommTimeoutError`), ``False`` for any
            other failure (:class:`~commlib.errors.CommError`).

        Examples:
            >>> plugin = commlib.plugins.resolve_backend("single")
            >>> plugin.is_timeout(RuntimeError("operation timed out after 30000ms"))
            True
            >>> plugin.is_timeout(RuntimeError("connection reset by peer"))
            False
        """
        text = str(exc).lower()
        return "timed out" in text or "timeout" in text

    def describe_failure(self, exc: BaseException) -> str:
        """The engine's failure ``exc`` in a few words, for a commlib error's message.

        Asked only on the failure path. The default is the exception's text;
        a backend whose engine adds source locations or boilerplate to its
        messages overrides it to keep what a user needs.

        Args:
            exc: what the engine raised.

        Returns:
            One line of text; commlib puts it after the collective and rank.

        Examples:
            >>> plugin = commlib.plugins.resolve_backend("single")
            >>> plugin.describe_failure(RuntimeError("connection reset by peer"))
            'connection reset by peer'
        """
        return str(exc)

    def failed_peer(self, exc: BaseException, group: Group) -> int | None:
        """The rank of ``group`` whose connection the engine's failure ``exc`` says was lost.

        Asked only on the failure path, so it may be slow (read the store,
        parse the engine's text); ``None`` when it names no peer or the peer
        cannot be told. commlib names that rank, and its world rank, in the
        error every surviving rank raises. The default knows none: an engine
        that names a peer only by its address maps the address to a rank (the
        gloo backend reads the addresses gloo published in the store).

        Examples:
            >>> plugin = commlib.plugins.resolve_backend("single")
            >>> plugin.failed_peer(RuntimeError("connection reset by peer"), None) is None
            True
        """
        return None

    def lost_peer(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a peer's connection was lost (:meth:`failed_peer` named none).

        ``True`` makes it a :class:`~commlib.errors.RankLostError` (what ``shrink``
        recovers from), not a ``CommError`` of an engine that refused the call.

        Examples:
            >>> commlib.plugins.resolve_backend("single").lost_peer(RuntimeError("x"))
            False
        """
        return False

    def waits_on_stream(self) -> bool:
        """Whether a blocking call's ``Work.wait()`` orders the caller's stream, not the host.

        torch's NCCL: ``wait()`` makes the current stream wait for the collective and
        returns at once; ``wait(timeout)`` blocks the host in 1 ms sleeps until the
        device is done. ``True``: commlib waits as torch's blocking call does, and a
        hang ends at the engine's own timeout (:meth:`set_timeout`, set per call).

        Examples:
            >>> commlib.plugins.resolve_backend("gloo").waits_on_stream()
            False
        """
        return False

    def set_timeout(self, group: Group, timeout: datetime.timedelta) -> None:
        """Make the engine give up on ``group``'s operations issued from now on after ``timeout``.

        The engine calls it with the timeout of each call before issuing it,
        so an operation a communicator stopped waiting for also ends inside the
        engine, and the process can exit. The default sets the process
        group's own timeout (``ProcessGroup.set_timeout``); an engine without
        one keeps its own.

        Args:
            group: as for :meth:`all_reduce` (``None``: nothing to do).
            timeout: the call's timeout, positive.

        Returns:
            Nothing; an engine that cannot do it silently keeps its own.

        Examples:
            >>> plugin.set_timeout(group, datetime.timedelta(seconds=30))  # doctest: +SKIP
        """
        if group is None:
            return
        try:
            torch_facts.set_timeout(group, timeout)  # torch 2.14's public one where it has it
        except (RuntimeError, AttributeError, NotImplementedError):
            pass  # the engine has no per-group timeout; its own stays in force

    def abort(self, group: Group) -> None:
        """Stop what is in flight on ``group``; called once, when ``group`` broke.

        The default asks the process group to abort (``ProcessGroup.abort``):
        engines that have it end their pending operations; the others end them
        by the timeout :meth:`set_timeout` gave them.

        Args:
            group: the broken group (``None``: nothing to do).

        Returns:
            Nothing; it must not raise or block.

        Examples:
            >>> plugin.abort(group)  # doctest: +SKIP
        """
        if group is None:
            return
        try:
            group.abort()
        except (RuntimeError, AttributeError, NotImplementedError):
            pass  # nothing to abort with; the operations' own timeouts end them

    def shrink_group(
        self, group: Group, keep: Sequence[int], name: str, timeout: datetime.timedelta
    ) -> Group:
        """A new process group over ``keep`` (ranks of ``group``, in order), made by them alone.

        Called on every rank in ``keep`` (and only there: the others are dead
        or left out) once they agreed on ``keep``; the new group's rank ``i``
        is ``keep[i]``. ``name`` is the same on all of them and new each time.
        The default builds a fresh process group of :attr:`torch_backend`
        over the ranks' world ranks, connecting through the world's store
        (as ``new_group`` does, but without the ranks that are gone), so it
        works for engines that connect through the store (gloo, and custom
        engines registered with torch). A backend whose engine can shrink
        its communicators itself overrides it.

        Args:
            group: the broken group, as for :meth:`all_reduce`.
            keep: surviving ranks of ``group``, the same list on every
                survivor (agreed by the core), this rank among them.
            name: a unique group name, the same on every survivor.
            timeout: the new group's operation timeout.

        Returns:
            The new group, on which this rank is ``keep.index(own rank)``.

        Raises:
            NotImplementedError: the engine cannot build a group this way
                (``RuntimeError`` also; the core reports either as a ``CommError``).

        Examples:
            >>> survivors = plugin.shrink_group(group, [0, 2, 3], "0.shrunk0", timedelta(60))
            ... # doctest: +SKIP
            >>> dist.get_world_size(survivors)  # doctest: +SKIP
            3
        """
        return build_group(group, keep, name, timeout, self.torch_backend, self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} torch_backend={self.torch_backend!r}>"
