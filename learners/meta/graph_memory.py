"""How much memory autograd graphs hold: the tensors saved for backward behind some outputs.

Used to show that first-order inner loops keep a flat graph while second-order ones grow
with the number of inner steps (``bench/learners.py``), and that no graph outlives a
meta-step (the learner-state tests).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def saved_tensor_bytes(outputs: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages saved for backward in the graphs behind ``outputs``;
    graphs already freed by a backward pass count 0."""
    seen, storages, stack = set(), {}, [t.grad_fn for t in outputs]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attribute in dir(node):
            if not attribute.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attribute)
            except RuntimeError:  # freed by a backward pass
                continue
            for item in value if isinstance(value, tuple | list) else (value,):
                if isinstance(item, torch.Tensor):
                    storage = item.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
        stack.extend(child for child, _ in node.next_functions)
    return sum(storages.values())
