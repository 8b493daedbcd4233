"""A node of a trace's message graph, as verifiers' episode record holds it.

Two places build these nodes: the synthetic episodes of ``produce/`` (demo
and test data) and the records ``read/`` synthesizes from other
instrumentations' spans. They must build the same shape, field for field.
``produce/`` and ``read/`` never import each other (the two ends of the
pipeline meet only in the base modules; see docs/architecture.md), so the
one builder lives here, a base module both may import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def message_node(
    message: dict[str, Any],
    parent: int | None,
    timestamp: float,
    *,
    sampled: bool = False,
    tools: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One message of the graph: ``parent`` is the index of the node it
    follows (``None`` for a root), ``sampled`` marks what the model wrote,
    and a root carries the tools offered with it. Token ids, masks and
    logprobs stay empty: neither side has them."""
    node: dict[str, Any] = {} if parent is None else {"parent": parent}
    if parent is None and tools:
        node["tools"] = [dict(tool) for tool in tools]
    node.update(
        {
            "semantic_parents": [],
            "message": message,
            "sampled": sampled,
            "timestamp": timestamp,
            "token_ids": [],
            "mask": [],
            "is_content": [],
            "logprobs": [],
        }
    )
    return node
