"""Testing tools for commlib and for backend-plugin authors.

* :class:`~commlib.testing.harness.World`: N local ranks started once, many runs.
* :mod:`commlib.testing.strategies`: hypothesis strategies for picklable objects
  holding arrays and tensors (needs ``hypothesis``).
"""

from commlib.testing.harness import Outcome, RankDied, RankFailed, World, WorldTimeout

__all__ = ["Outcome", "RankDied", "RankFailed", "World", "WorldTimeout"]
