"""Graph nodes are module-level functions; `bind` gives one its build-time dependencies, and
`on_loop` keeps a quick synchronous one on the event loop."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
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


def on_loop(node: Callable[..., R], /) -> Callable[..., Awaitable[R]]:
    """`node`, a synchronous node or router, called on the event loop rather than in a thread.

    In an async run LangGraph calls a synchronous node or router through `run_in_executor`: a
    worker-thread hop on every call. For a function that only reads the state (a router, a
    node that picks the next step or raises an interrupt) the hop costs far more than the
    function: ~0.8 ms of CPU per call in `bench.turn_cpu` (the Assistant's `tools_condition`,
    once a turn). Name, signature and return hints are kept, as `bind` keeps them, so LangGraph
    still injects `runtime` and reads a router's destinations. Only for functions that do no
    blocking I/O: they now run on the loop.
    """

    @functools.wraps(node)
    async def run(*args: Any, **kwargs: Any) -> R:
        return node(*args, **kwargs)

    return run


def declare_subgraph(graph: G, node: str, subgraph: Any) -> G:
    """Record that `node` runs `subgraph`, as LangGraph records it for a closure that calls one.

    LangGraph finds a node's subgraph by reading the node function's closure; a bound node has
    none. Declared, the subgraph shows in `get_graph(xray=...)`, `get_state(subgraphs=True)` and
    the debug stream, as it did when the nodes were closures.
    """
    graph.nodes[node].subgraphs = [subgraph]
    return graph
