"""``python -m commlib``: the ``commlib`` console script, for an environment without it on PATH.

Examples:
    >>> import subprocess, sys
    >>> out = subprocess.run([sys.executable, "-m", "commlib", "--help"], capture_output=True)
    >>> out.returncode, b"bench" in out.stdout
    (0, True)
"""

from __future__ import annotations

import sys

from commlib.cli import main

if __name__ == "__main__":
    sys.exit(main())
