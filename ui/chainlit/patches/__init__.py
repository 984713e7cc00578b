"""Every place Cairn patches Chainlit or copies its internals, one module per reason.

Chainlit trusts the client with session ids, thread ids, socket event shapes and ask answers;
it blocks the event loop in every Step; it renders model text as given; it keeps its uploads
folder, thread ACL and sockets in module globals. Each module names the Chainlit code it relies
on and why it exists; tests/unit/test_chainlit_patches.py pins a hash of that Chainlit source
and fails, naming the patch to re-check, when an upgrade changes it.

- `sockets`: every socket handler checks its frame first; socket.io checks the Origin.
- `edits`: editing a message forks the LangGraph thread.
- `uploads`: a private uploads folder per process.
- `clock`: Chainlit's 1 ms sleep per Step/Message only when needed.
- `acl`: one answer for unknown and foreign threads.
- `output`: the sanitising emitter and task list.
- `sessions`: Chainlit's socket registry and context, for code outside a socket event.

Chainlit is mounted into Cairn's own FastAPI app (app.py), so nothing here serves
`chainlit run`: the event loop, routes, start-up and CORS are the app's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ui.chainlit.patches.acl import require_thread_author
from ui.chainlit.patches.clock import space_out_steps
from ui.chainlit.patches.edits import route_message_edits
from ui.chainlit.patches.output import guard_output
from ui.chainlit.patches.sockets import check_socket_origins, guard_socket_events
from ui.chainlit.patches.uploads import relocate_files

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

CHAINLIT_VERSION = "2.12.0"
"""The Chainlit release every patch and copy in this package was checked against."""


def install(
    *, files_parent: Path, origins: Sequence[str], max_message_chars: int | None = None
) -> Path:
    """Apply every patch once per process (again: no patch wraps or replaces twice); returns
    this process's uploads folder. Runs after Chainlit's config is set (ui/chainlit/config.py)."""
    import chainlit.server

    route_message_edits(chainlit.server.sio)
    guard_socket_events(chainlit.server.sio, max_message_chars=max_message_chars)
    check_socket_origins(chainlit.server.sio, origins)
    folder = relocate_files(files_parent)
    space_out_steps()
    # Chainlit's thread routes call the name imported into chainlit.server.
    chainlit.server.is_thread_author = require_thread_author  # type: ignore[assignment]
    guard_output()
    return folder
