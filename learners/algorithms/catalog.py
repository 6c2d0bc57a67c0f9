"""Every algorithm family, registered: import this module (not a family's) to ask the registry.

Adding a family is one module in this room ending in its `register_algorithm(...)` line, and
one import here (docs/learners.md#adding-an-algorithm).
"""

from __future__ import annotations

from learners.algorithms import context, macaw, maml
from learners.algorithms.registry import (
    Algorithm,
    algorithm_for,
    registered_algorithms,
    registered_names,
)

__all__ = ["Algorithm", "algorithm_for", "registered_algorithms", "registered_names"]

FAMILIES = (context, macaw, maml)
"""The modules whose registration lines have run."""
