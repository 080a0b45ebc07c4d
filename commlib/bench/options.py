"""``commlib bench``'s options: the command-line flags and the settings they make."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from commlib.bench.cases import select_cases
from commlib.bench.dispatch_cases import select_dispatch
from commlib.bench.units import parse_size, size_sweep

if TYPE_CHECKING:
    from commlib.backend import Backend


#: ``--strict`` values: the communicator's own mode, strict, unchecked, default and unchecked
STRICT_MODES = ("default", "on", "off", "both")


@dataclass(frozen=True)
class BenchOptions:
    """Everything a benchmark run needs; picklable, so it travels to the ranks.

    Examples:
        >>> BenchOptions(max_bytes=1 << 20, ops="all_reduce").sizes()[-1]
        1048576
    """

    nproc: int = 2
    backend: str | None = None
    min_bytes: int = 1 << 10
    max_bytes: int = 16 << 20
    factor: float = 4.0
    iters: int = 10
    trials: int = 5
    warmup: int = 3
    ops: str | None = None
    json: str | None = None
    plot: str | None = None
    timeout: float = 120.0
    format: str = "text"
    progress: bool = True
    memory: bool = True
    calls: int = 1000
    strict: str = "default"

    def sizes(self) -> list[int]:
        """The swept sizes in bytes.

        Examples:
            >>> BenchOptions(min_bytes=1024, max_bytes=4096, factor=2).sizes()
            [1024, 2048, 4096]
        """
        return size_sweep(self.min_bytes, self.max_bytes, self.factor)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at_least(kind: type, low: float, what: str) -> Callable[[str], object]:
    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    return parse


def _positive(kind: type) -> Callable[[str], object]:
    return _at_least(kind, 1e-9, "positive")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``commlib bench``'s flags to ``parser``.

    Examples:
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> options_from(p.parse_args(["--max-bytes", "1M"])).max_bytes
        1048576
    """
    d = BenchOptions()
    add = parser.add_argument
    add(
        "--nproc",
        type=_positive(int),
        default=d.nproc,
        help="local ranks to start (default %(default)s); ignored under torchrun; for "
        "--ops dispatch, the world size of torch's fake process group",
    )
    add(
        "--backend",
        default=d.backend,
        help="commlib backend, torch.distributed backend, or a plugin class as "
        "module:Class (default: the one the plugins choose for this machine, see "
        "`commlib info`); --ops dispatch alone times an accelerator's plugin over "
        "simulated devices where the device is absent",
    )
    add(
        "--min-bytes",
        type=_size,
        default=d.min_bytes,
        metavar="SIZE",
        help="smallest size, e.g. 512, 1K (default 1K)",
    )
    add(
        "--max-bytes",
        type=_size,
        default=d.max_bytes,
        metavar="SIZE",
        help="largest size, e.g. 8M, 1G (default 16M)",
    )
    add(
        "--factor",
        type=float,
        default=d.factor,
        help="size multiplier between rows (default %(default)g)",
    )
    add(
        "--iters",
        type=_positive(int),
        default=d.iters,
        help="timed calls of each side per trial, up to 1M; fewer above, at least 3 "
        "(default %(default)s)",
    )
    add(
        "--trials",
        type=_positive(int),
        default=d.trials,
        help="repeated trials per size, commlib and torch interleaved in each; a row is the "
        "median over them, with the spread of the per-trial ratio (default %(default)s)",
    )
    add(
        "--warmup",
        type=_at_least(int, 0, "0 or more"),
        default=d.warmup,
        help="untimed calls per size first; the first is checked (default %(default)s)",
    )
    add(
        "--ops",
        default=d.ops,
        metavar="LIST",
        help="comma-separated cases, collectives or kinds (tensor, object, latency, helper); "
        "default: all. `dispatch` (not in all): what a call costs on its way to the engine, "
        "commlib against torch, on torch's fake process group in this process; one of its "
        "cases: all_reduce[dispatch]",
    )
    add(
        "--calls",
        type=_positive(int),
        default=d.calls,
        help="--ops dispatch: timed calls of each side per trial (default %(default)s)",
    )
    add(
        "--strict",
        choices=STRICT_MODES,
        default=d.strict,
        help="how commlib's side checks its arguments across ranks: default (as a program "
        "gets it: COMMLIB_STRICT, else the backend's default), on "
        "(strict=True), off (strict=False), or both: the default and unchecked in the same "
        "run, interleaved, a column each, so a row shows what the check costs "
        "(default %(default)s)",
    )
    add("--json", default=d.json, metavar="FILE", help="write every row, every column, as JSON")
    add(
        "--plot",
        default=d.plot,
        metavar="FILE.png",
        help="draw bus bandwidth against size (needs matplotlib: pip install 'commlib[plot]')",
    )
    add(
        "--timeout",
        type=_positive(float),
        default=d.timeout,
        metavar="SECONDS",
        help="a collective that waits longer fails the run (default %(default)g)",
    )
    add("--format", choices=("text", "markdown"), default=d.format, help="table format")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add("--no-memory", dest="memory", action="store_false", help="skip the peak-RSS probes")


def options_from(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` parsed flags describe (the sweep is validated here).

    Examples:
        >>> parser = argparse.ArgumentParser()
        >>> add_arguments(parser)
        >>> options_from(parser.parse_args(["--ops", "all_reduce"])).ops
        'all_reduce'
    """
    names = BenchOptions.__dataclass_fields__
    opts = BenchOptions(**{k: v for k, v in vars(args).items() if k in names})
    # fail here, before any rank starts, on a sweep or case list that makes no sense
    opts.sizes()
    if opts.strict not in STRICT_MODES:
        raise ValueError(f"--strict must be one of {', '.join(STRICT_MODES)}, got {opts.strict!r}")
    across_ranks, dispatch = select_cases(opts.ops), select_dispatch(opts.ops)
    if opts.plot and not across_ranks:
        raise ValueError("--plot draws bus bandwidth, which the dispatch cases do not have")
    if dispatch and opts.backend is None:
        backend_plugin(None)  # a machine with no backend that drives a process group
    if opts.backend is not None:
        # the dispatch kind alone may time an absent accelerator over simulated devices
        check_backend(opts.backend, dispatch=bool(dispatch) and not across_ranks)
    return opts


def backend_plugin(name: str | None, *, dispatch: bool = False) -> Backend:
    """The plugin ``name`` means: a commlib plugin, the one driving that torch backend, or
    ``module:Class`` (:mod:`commlib.bench.named_plugin`).

    ``None`` is the plugin the plugins choose for this machine (``commlib info``).
    Raises ``ValueError`` unless it drives a process group and can run here;
    for the dispatch kind alone (``dispatch``), an accelerator commlib
    simulates may be absent: it is then timed over simulated devices.

    Examples:
        >>> backend_plugin("gloo").name
        'gloo'
        >>> backend_plugin(None).torch_backend is not None
        True
        >>> backend_plugin("hccl", dispatch=True).name   # no torch_npu: simulated later
        'hccl'
    """
    from commlib import plugins
    from commlib.bench.named_plugin import load_named, simulates

    if name is None:
        plugin = plugins.backend_for_group()
        name = plugin.name
    else:
        plugin = load_named(name)  # its ValueError lists what is registered
    if plugin.torch_backend is None:
        raise ValueError(f"backend {name!r} runs without a process group: nothing to compare")
    reason = plugin.unavailable_reason()
    if reason and not (dispatch and simulates(plugin)):
        raise ValueError(f"backend {name!r} cannot run here: {reason}")
    return plugin


def check_backend(name: str, *, dispatch: bool = False) -> None:
    """Raise ``ValueError`` unless ``name`` is a backend that can run the benchmark here.

    ``name`` is a commlib plugin name or the torch.distributed backend one drives.

    Examples:
        >>> check_backend("gloo")
        >>> check_backend("single")
        Traceback (most recent call last):
        ...
        ValueError: backend 'single' runs without a process group: nothing to compare
        >>> check_backend("nccl")        # a torch without CUDA  # doctest: +SKIP
        Traceback (most recent call last):
        ...
        ValueError: backend 'nccl' cannot run here: torch was built without NCCL
    """
    backend_plugin(name, dispatch=dispatch)
