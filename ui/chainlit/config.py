"""Chainlit's settings from Cairn's: set once, before Chainlit's server module is imported."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from chainlit.config import config as chainlit_config

from ui.security_headers import content_security_policy, script_hashes

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from graphs.core.settings import Settings

log = logging.getLogger("cairn")

CONFIG_PINS = {
    "chainlit.auth.jwt.get_jwt_secret": "28793c0c2967bfc8",
    "chainlit.server.get_user_facing_url": "94fc4ff9015031c8",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


def configure(
    settings: Settings, *, public_url: str, auth_secret: str, origins: Sequence[str]
) -> None:
    """Cairn's Settings are the one source; Chainlit's config.toml cannot loosen them.

    Chainlit reads the session-signing secret (auth/jwt.py `get_jwt_secret`) and the public
    address of OAuth redirects (server.py `get_user_facing_url`) from the environment at each
    use, and the rest from `chainlit.config.config`; its CORS middleware takes the allowed
    origins when chainlit.server is imported, which is why this runs first.
    """
    if "chainlit.server" in sys.modules and chainlit_config.project.allow_origins != list(origins):
        # Only a second app in one process (tests): its socket.io and Cairn's origin guard
        # still check the new origins (ui/chainlit/patches/sockets.py, ui/origin_guard.py).
        log.warning("Chainlit's CORS middleware keeps the origins it was first imported with")
    os.environ["CHAINLIT_AUTH_SECRET"] = auth_secret
    os.environ["CHAINLIT_URL"] = public_url
    project = chainlit_config.project
    project.allow_origins = list(origins)
    project.user_session_timeout = settings.session_hours * 3600
    chainlit_config.features.unsafe_allow_html = False  # raw HTML in Markdown stays off
    # The system's light or dark until the user picks one (Chainlit's UI knows "system"; its
    # config type lists only the two). Cairn's own pages follow the same (public/theme.js).
    chainlit_config.ui.default_theme = "system"  # type: ignore[assignment]
    upload = chainlit_config.features.spontaneous_file_upload
    if upload is not None:
        upload.accept = list(settings.upload_mime_types)
        upload.max_size_mb = settings.max_upload_mb
        upload.max_files = settings.max_upload_files


def ui_policy(public_url: str, image_origins: Iterable[str]) -> Callable[[], str]:
    """The Content-Security-Policy of Chainlit's UI, built at the first response (when its page
    is final): its inline scripts allowed by hash, nothing else."""
    origins = list(image_origins)

    def build() -> str:
        from chainlit.server import get_html_template

        page = get_html_template("")
        return content_security_policy(
            public_url, image_origins=origins, script_sources=script_hashes(page)
        )

    return build
