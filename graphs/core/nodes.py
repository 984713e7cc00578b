"""Graph nodes are module-level functions; `bind` gives one its build-time dependencies."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from langgraph.pregel import Pregel

R = TypeVar("R")
G = TypeVar("G", bound="Pregel[Any, Any, Any, Any]")


def bind(node: Callable[..., R], /, **deps: Any) -> Callable[..., R]:
    """`node` with keyword dependencies filled in, keeping its name, signature and hints.

    `builder.add_node(bind(assistant, deps=deps))` adds a node named "assistant"; LangGraph still
    sees the node's own signature (so it injects `runtime`) and the return hints of routers.
    Tests call the function itself: `await assistant(state, deps=deps)`.
    """
    bound = functools.partial(node, **deps)
    functools.update_wrapper(bound, node)
    return bound


def declare_subgraph(graph: G, node: str, subgraph: Any) -> G:
    """Record that `node` runs `subgraph`, as LangGraph records it for a closure that calls one.

    LangGraph finds a node's subgraph by reading the node function's closure; a bound node has
    none. Declared, the subgraph shows in `get_graph(xray=...)`, `get_state(subgraphs=True)` and
    the debug stream, as it did when the nodes were closures.
    """
    graph.nodes[node].subgraphs = [subgraph]
    return graph
