"""Client addresses: X-Forwarded-For counts only from a proxy the deployment names as trusted."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

if TYPE_CHECKING:
    from collections.abc import Sequence

    from starlette.types import ASGIApp

SERVER_SETTING = "FORWARDED_ALLOW_IPS"
"""uvicorn's own trusted-proxy setting, read when its server is configured."""


def distrust_server_proxy_headers() -> None:
    """uvicorn trusts X-Forwarded-For from 127.0.0.1 unless told otherwise, so any local client
    (or one behind a proxy that passes the header on) could name its own address. `chainlit run`
    configures uvicorn after loading app.py, so this reaches it: uvicorn trusts nobody, and
    `trusted_proxies` decides with Cairn's setting. (Serving with uvicorn directly: pass
    `--forwarded-allow-ips ''` or `proxy_headers=False`.)"""
    os.environ[SERVER_SETTING] = ""


def trusted_proxies(app: ASGIApp, *, trusted: Sequence[str]) -> ASGIApp:
    """The app with the client address (and scheme) taken from X-Forwarded-For/-Proto only for
    requests from one of `trusted`; the rightmost address not of a trusted proxy is the
    client's. Nothing trusted: the connecting address, whatever the headers say."""
    if not trusted:
        return app
    middleware: ASGIApp = ProxyHeadersMiddleware(app, trusted_hosts=list(trusted))  # type: ignore[arg-type,assignment]
    return middleware
