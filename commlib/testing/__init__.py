"""Testing tools for commlib and for backend-plugin authors.

* :class:`~commlib.testing.harness.World`: N local ranks started once, many runs.
* :mod:`commlib.testing.strategies`: hypothesis strategies for picklable objects
  holding arrays and tensors (needs ``hypothesis``).
* :mod:`commlib.testing.conformance`: the backend contract as a kit,
  ``run_conformance(name)`` or ``pytest --commlib-backend NAME``.
* :mod:`commlib.testing.simulated`: stand-in CUDA / NPU / MLU devices and
  engines, so the accelerator plugins run in CI.
"""

from commlib.testing.harness import Outcome, RankDied, RankFailed, World, WorldTimeout

__all__ = ["Outcome", "RankDied", "RankFailed", "World", "WorldTimeout"]
