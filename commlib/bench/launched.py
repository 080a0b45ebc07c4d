"""A rank of ``commlib bench`` that a backend's own launcher started (``mpiexec``).

Run by :func:`~commlib.bench.launcher.launch_with` as ``LAUNCHER python -m
commlib.bench.launched SPEC OUT``: ``SPEC`` is the pickled
:class:`~commlib.bench.BenchOptions` in hex; rank 0 writes its rows, pickled,
to ``OUT``. A failure prints its traceback and exits with status 1, which
ends the launcher's other ranks.
"""

from __future__ import annotations

import pickle
import sys
import traceback

from commlib.bench.runner import run_rank


def main(spec: str, out: str) -> int:
    """Run this rank's share; rank 0 writes the rows. The exit status."""
    opts = pickle.loads(bytes.fromhex(spec))
    try:
        rows = run_rank(opts)
    except BaseException:
        traceback.print_exc()
        return 1
    if rows is not None:
        with open(out, "wb") as f:
            pickle.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
