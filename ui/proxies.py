"""Client addresses: X-Forwarded-For counts only from a proxy the deployment names as trusted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fastapi import FastAPI


def trust_proxies(app: FastAPI, *, trusted: Sequence[str]) -> None:
    """The client address (and scheme) taken from X-Forwarded-For/-Proto only for requests from
    one of `trusted` (`CAIRN_FORWARDED_ALLOW_IPS`); the rightmost address not of a trusted proxy
    is the client's. Nothing trusted: the connecting address, whatever the headers say.

    Added last, so it runs first. uvicorn's own proxy handling is off (`python -m app` serves
    with `proxy_headers=False`): it trusts X-Forwarded-For from 127.0.0.1 by default, so any
    local client could name its own address.
    """
    if trusted:
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(trusted))
