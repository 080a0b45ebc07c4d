"""The ``commlib`` command: ``commlib info`` (and more subcommands as they come)."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence


def info(out=None) -> int:
    """Print the registered backends, their availability and the environment.

    Examples:
        $ commlib info
    """
    out = out or sys.stdout
    import torch

    import commlib
    from commlib.launch import default_torch_backend

    print(
        f"commlib {commlib.__version__}  torch {torch.__version__}  "
        f"python {platform.python_version()}",
        file=out,
    )
    accel = getattr(torch, "accelerator", None)
    device = "cpu"
    if accel is not None and accel.is_available():
        device = str(accel.current_accelerator())
    print(
        f"default device: {device}   default torch.distributed backend: {default_torch_backend()}",
        file=out,
    )
    rows = [("backend", "torch backend", "device", "available", "plugin / reason")]
    for b in commlib.list_backends():
        rows.append(
            (
                b.name,
                b.torch_backend or "-",
                b.device_type,
                "yes" if b.available else "no",
                b.plugin if b.available else b.reason or "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4], file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``commlib`` console script."""
    parser = argparse.ArgumentParser(prog="commlib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="registered backends, availability, torch version, device")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    return 2


if __name__ == "__main__":
    sys.exit(main())
