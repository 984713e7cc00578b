"""Cairn's own small OpenID Connect provider, so the real OAuth code flow also runs offline."""

import base64
import hashlib
import hmac
import html
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol
from urllib.parse import parse_qsl, quote, unquote_plus, urlencode, urlsplit, urlunsplit

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import RSAKey
from joserfc.jwt import JWTClaimsRegistry
from psycopg.rows import dict_row
from pydantic import BaseModel

from auth.local_accounts import Account, AccountError, LocalAccounts
from auth.throttle import AttemptCounter, PgAttemptCounter, Throttle, Throttled
from graphs.core.persistence import Pool

ROUTER_PREFIX = "/local-oidc"
CODE_TTL_SECONDS = 60
TOKEN_TTL_SECONDS = 300
SUPPORTED_SCOPES = ("openid", "profile", "email")
# The code table has no scope column, so every access token carries the full (small) set.
GRANTED_SCOPE = " ".join(SUPPORTED_SCOPES)
MAX_PARAM_LENGTH = 512
MAX_REDIRECT_URI_LENGTH = 2048
CSRF_COOKIE = "cairn_local_oidc_csrf"
CSRF_COOKIE_MAX_AGE = 3600
_ALGORITHM = "RS256"
_CLAIMS_SUPPORTED = ["sub", "iss", "nonce", "name", "preferred_username", "email", "groups"]
_ACCESS_JWT_TYPE = "at+jwt"
_CSRF_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")
_CALLBACK_PATH = re.compile(r"(/[^/?#]+)*/auth/oauth/[A-Za-z0-9_-]+/callback")


@dataclass(frozen=True)
class CodeGrant:
    """What an authorization code stands for until it is redeemed."""

    subject: str
    client_id: str
    redirect_uri: str
    nonce: str | None


class CodeStore(Protocol):
    """Single-use authorization codes, keyed by the sha256 of the code."""

    async def save(self, code_hash: str, grant: CodeGrant, ttl_seconds: int) -> None: ...

    async def redeem(self, code_hash: str) -> CodeGrant | None:
        """Atomically mark the code used; None if unknown, already used or expired."""
        ...


class PgCodeStore:
    """Codes in Postgres, so whichever app worker gets the token request can redeem them."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def save(self, code_hash: str, grant: CodeGrant, ttl_seconds: int) -> None:
        async with self._pool.connection() as conn:
            # Piggy-back clean-up on issuing: the table only ever holds recent codes.
            await conn.execute(
                "DELETE FROM local_oidc_codes WHERE expires_at < now() - interval '1 hour'"
            )
            await conn.execute(
                "INSERT INTO local_oidc_codes"
                " (code_hash, subject, client_id, redirect_uri, nonce, expires_at)"
                " VALUES (%s, %s, %s, %s, %s, now() + make_interval(secs => %s))",
                (
                    code_hash,
                    grant.subject,
                    grant.client_id,
                    grant.redirect_uri,
                    grant.nonce,
                    ttl_seconds,
                ),
            )

    async def redeem(self, code_hash: str) -> CodeGrant | None:
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "UPDATE local_oidc_codes SET used_at = now()"
                " WHERE code_hash = %s AND used_at IS NULL AND expires_at > now()"
                " RETURNING subject, client_id, redirect_uri, nonce",
                (code_hash,),
            )
            row = await cur.fetchone()
        return CodeGrant(**row) if row else None


def load_or_create_signing_key(path: Path) -> RSAKey:
    """Load the RSA signing key from `path` (JWK JSON or PEM), creating it (0600) on first start."""
    if not path.exists():
        _create_key_file(path)
    if path.stat().st_mode & 0o077:
        msg = f"Signing key {path} is readable by other users; run: chmod 600 {path}"
        raise PermissionError(msg)
    raw = path.read_bytes()
    key = RSAKey.import_key(json.loads(raw) if raw.lstrip().startswith(b"{") else raw)
    if not key.is_private:
        msg = f"Signing key {path} holds no private key"
        raise ValueError(msg)
    return key


def _create_key_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    key = RSAKey.generate_key(2048, private=True)
    # A private JWK for `.json` paths, PEM otherwise; loading accepts either.
    if path.suffix == ".json":
        content = json.dumps(key.as_dict(private=True)).encode()
    else:
        content = key.as_pem(private=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as temp_file:
            temp_file.write(content)
        # link() never overwrites: when workers start together, the first key wins and
        # nobody reads a half-written file.
        os.link(temp_name, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(temp_name)


class AuthorizeRequest(BaseModel):
    """The OAuth authorization request, from the query string or the login form."""

    client_id: str = ""
    redirect_uri: str = ""
    response_type: str = ""
    state: str = ""
    nonce: str = ""
    scope: str = ""


class LoginForm(AuthorizeRequest):
    """The login form: the authorization request carried in hidden fields, plus credentials."""

    username: str = ""
    password: str = ""
    mode: str = "signin"
    csrf_token: str = ""


class TokenForm(BaseModel):
    """The token request; client credentials may come in the form or as HTTP Basic auth."""

    grant_type: str = ""
    code: str = ""
    redirect_uri: str = ""
    client_id: str = ""
    client_secret: str = ""


class _LoginRefused(Exception):
    """A sign-in attempt that should re-render the form with a message."""

    def __init__(self, status: int, message: str, *, retry_after: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


class _OAuthError(Exception):
    """An RFC 6749 error for the token endpoint's JSON body."""

    def __init__(self, status: int, error: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.error = error
        self.description = description


_PAGE_CSS = """
body{margin:0;min-height:100vh;display:grid;place-items:center;background:#f5f5f4;
font:16px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1c1917}
main{box-sizing:border-box;width:min(26rem,calc(100vw - 1.5rem));padding:clamp(1.25rem,5vw,2rem);background:#fff;border-radius:12px;
box-shadow:0 1px 3px rgb(0 0 0 / .12)}
h1{margin:0 0 1.25rem;font-size:1.35rem}
label{display:block;margin:.75rem 0 .25rem;font-weight:600}
input{box-sizing:border-box;width:100%;padding:.55rem .7rem;border:1px solid #a8a29e;
border-radius:8px;font:inherit}
input:focus,button:focus{outline:3px solid #2563eb;outline-offset:2px}
.actions{display:flex;gap:.75rem;margin-top:1.5rem;flex-wrap:wrap}
button{flex:1;padding:.6rem 1rem;border-radius:8px;border:1px solid #1c1917;font:inherit;
cursor:pointer;background:#fff;color:#1c1917}
button[value=signin]{background:#1c1917;color:#fff}
.error{margin:0 0 1rem;padding:.6rem .8rem;border-radius:8px;background:#fee2e2;color:#7f1d1d}
.hint{margin:1rem 0 0;font-size:.875rem;color:#57534e}
.intro{margin:0 0 1rem}ul.agents{margin:0 0 1.25rem;padding-left:1.1rem}
ul.agents li{margin:.35rem 0}form.provider{margin:.5rem 0 0;display:flex}
@media (prefers-color-scheme:dark){body{background:#1c1917;color:#f5f5f4}
main{background:#292524}button{background:#292524;color:#f5f5f4;border-color:#d6d3d1}
button[value=signin]{background:#f5f5f4;color:#1c1917}.hint{color:#d6d3d1}
input{background:#1c1917;color:#f5f5f4}}
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_PAGE_CSS.encode()).digest()).decode()
# No scripts at all, only the one inline stylesheet above, and never inside a frame.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it Chromium sends `Origin: null` on the form's POST, which the
    # origin check (ui/origin_guard.py) refuses. Other sites still get no referrer.
    "Referrer-Policy": "same-origin",
}
_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_PAGE_CSS}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


def render_login_page(
    params: AuthorizeRequest,
    *,
    csrf_token: str,
    allow_signup: bool,
    username: str = "",
    error: str | None = None,
) -> str:
    """The sign-in form; every interpolated value is HTML-escaped."""
    esc = html.escape
    hidden = "\n".join(
        f'<input type="hidden" name="{name}" value="{esc(getattr(params, name))}">'
        for name in ("client_id", "redirect_uri", "response_type", "state", "nonce", "scope")
    )
    described = ' aria-describedby="form-error" aria-invalid="true"' if error else ""
    alert = f'<p class="error" role="alert" id="form-error">{esc(error)}</p>\n' if error else ""
    signup = (
        '<button type="submit" name="mode" value="signup">Create account</button>'
        if allow_signup
        else ""
    )
    hint = (
        '<p class="hint">New here? Choose a username and a password of at least 8 characters,'
        " then select Create account.</p>"
        if allow_signup
        else ""
    )
    body = (
        f"<h1>Sign in to Cairn</h1>\n{alert}"
        '<form method="post" action="authorize">\n'
        f'<input type="hidden" name="csrf_token" value="{esc(csrf_token)}">\n{hidden}\n'
        '<label for="username">Username</label>\n'
        '<input id="username" name="username" autocomplete="username" required maxlength="64"'
        f' autocapitalize="none" spellcheck="false" value="{esc(username)}"{described}>\n'
        '<label for="password">Password</label>\n'
        '<input id="password" type="password" name="password" autocomplete="current-password"'
        f' required maxlength="256"{described}>\n'
        '<div class="actions">\n'
        '<button type="submit" name="mode" value="signin">Sign in</button>\n'
        f"{signup}\n</div>\n{hint}\n</form>"
    )
    return _page("Sign in to Cairn", body)


def render_entry_page(
    providers: Sequence[tuple[str, str]],
    *,
    agents: Sequence[tuple[str, str]],
    error: str | None = None,
) -> str:
    """The app's sign-in entry: what Cairn is, then one button per sign-in provider (id, name)."""
    esc = html.escape
    alert = f'<p class="error" role="alert">{esc(error)}</p>\n' if error else ""
    listed = "\n".join(
        f"<li><strong>{esc(name)}</strong>: {esc(text)}</li>" for name, text in agents
    )
    buttons = "\n".join(
        f'<form class="provider" method="get" action="/auth/oauth/{quote(pid, safe="")}">'
        f'<button type="submit" value="signin">Continue with {esc(name)}</button></form>'
        for pid, name in providers
    )
    if not providers:
        buttons = '<p class="error" role="alert">No sign-in is configured on this server.</p>'
    body = (
        f"<h1>Welcome to Cairn</h1>\n{alert}"
        '<p class="intro">Three agents, one workspace. Your conversations are yours alone.</p>\n'
        f'<ul class="agents">\n{listed}\n</ul>\n{buttons}'
    )
    return _page("Sign in - Cairn", body)


def render_error_page(reason: str) -> str:
    """A dead end for authorization requests we must not redirect back from."""
    body = (
        "<h1>This sign-in link is not valid</h1>\n"
        f'<p class="error" role="alert">{html.escape(reason)}</p>\n'
        "<p>Go back to Cairn and start signing in again.</p>"
    )
    return _page("Sign-in problem - Cairn", body)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _redirect_uri_problem(redirect_uri: str, *, issuer_origin: str) -> str | None:
    """Why `redirect_uri` is not one of our own OAuth callbacks, or None if it is."""
    if not redirect_uri or len(redirect_uri) > MAX_REDIRECT_URI_LENGTH:
        return "The redirect address is missing or too long."
    if any(char in redirect_uri for char in "\\\r\n\t "):
        return "The redirect address is malformed."
    parts = urlsplit(redirect_uri)
    segments = parts.path.split("/")
    # Compare parsed origins: a prefix test would let http://host:8000.evil.example through.
    if (
        _origin(redirect_uri) != issuer_origin
        or parts.fragment
        or "." in segments
        or ".." in segments
        or not _CALLBACK_PATH.fullmatch(parts.path)
    ):
        return "The redirect address does not belong to this Cairn server."
    return None


def _with_query(url: str, params: dict[str, str]) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    query += [(name, value) for name, value in params.items() if value]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _same_secret(given: str, expected: str) -> bool:
    # Bytes, because compare_digest refuses non-ASCII str and clients control `given`.
    return hmac.compare_digest(given.encode(), expected.encode())


def _client_ip(request: Request) -> str:
    # The connecting address, or the one a trusted proxy forwarded (ui/proxies.py): never a
    # header the client chose.
    return request.client.host if request.client else "unknown"


class _Provider:
    """Route handlers of the provider, sharing its configuration."""

    def __init__(
        self,
        *,
        accounts: LocalAccounts,
        codes: CodeStore,
        attempts: AttemptCounter,
        key: RSAKey,
        issuer: str,
        client_id: str,
        client_secret: str,
        allow_signup: bool,
        clock: Callable[[], float],
        groups: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self._groups = dict(groups or {})
        """Username -> the groups userinfo reports (CAIRN_LOCAL_GROUPS)."""
        self._accounts = accounts
        self._codes = codes
        self._key = key
        self._kid = key.thumbprint()
        self._issuer = issuer
        self._issuer_origin = _origin(issuer)
        self._cookie_path = urlsplit(issuer).path
        self._secure_cookie = issuer.startswith("https://")
        self._client_id = client_id
        self._client_secret = client_secret
        self._allow_signup = allow_signup
        self._clock = clock
        self._throttle = Throttle(attempts)

    async def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self._issuer,
            "authorization_endpoint": f"{self._issuer}/authorize",
            "token_endpoint": f"{self._issuer}/token",
            "userinfo_endpoint": f"{self._issuer}/userinfo",
            "jwks_uri": f"{self._issuer}/jwks",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": [_ALGORITHM],
            "scopes_supported": list(SUPPORTED_SCOPES),
            "token_endpoint_auth_methods_supported": ["client_secret_post", "client_secret_basic"],
            "claims_supported": _CLAIMS_SUPPORTED,
        }

    async def jwks(self) -> dict[str, Any]:
        public = self._key.as_dict(private=False)
        return {"keys": [{**public, "kid": self._kid, "use": "sig", "alg": _ALGORITHM}]}

    async def show_login(
        self, request: Request, params: Annotated[AuthorizeRequest, Query()]
    ) -> HTMLResponse:
        if problem := self._request_problem(params):
            return HTMLResponse(render_error_page(problem), 400, headers=PAGE_HEADERS)
        return self._login_page(request, params, status=200)

    async def submit_login(self, request: Request, form: Annotated[LoginForm, Form()]) -> Response:
        if problem := self._request_problem(form):
            return HTMLResponse(render_error_page(problem), 400, headers=PAGE_HEADERS)
        try:
            self._check_csrf(request, form)
            account = await self._authenticate(form, _client_ip(request))
        except _LoginRefused as refusal:
            return self._login_page(request, form, status=refusal.status, error=refusal)
        code = secrets.token_urlsafe(32)
        grant = CodeGrant(account.subject, form.client_id, form.redirect_uri, form.nonce or None)
        await self._codes.save(_hash_code(code), grant, CODE_TTL_SECONDS)
        target = _with_query(form.redirect_uri, {"code": code, "state": form.state})
        return RedirectResponse(target, status_code=302, headers=_NO_STORE)

    async def token(self, request: Request, form: Annotated[TokenForm, Form()]) -> JSONResponse:
        try:
            self._check_client(request, form)
            account, grant = await self._redeem(form)
        except _OAuthError as error:
            body = {"error": error.error, "error_description": error.description}
            headers = dict(_NO_STORE)
            if error.status == 401:
                headers["WWW-Authenticate"] = 'Basic realm="cairn-local-oidc"'
            return JSONResponse(body, error.status, headers=headers)
        return JSONResponse(self._issue_tokens(account, grant), headers=_NO_STORE)

    async def userinfo(self, request: Request) -> JSONResponse:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _bearer_challenge('Bearer realm="cairn-local-oidc"')
        subject = self._verified_subject(token.strip())
        account = await self._accounts.get_by_subject(subject) if subject else None
        if account is None:
            return _bearer_challenge('Bearer realm="cairn-local-oidc", error="invalid_token"')
        return JSONResponse(
            {
                "sub": account.subject,
                "preferred_username": account.username,
                "name": account.display_name or account.username,
                "email": f"{account.username}@local.invalid",
                **(
                    {"groups": list(self._groups[account.username])}
                    if account.username in self._groups
                    else {}
                ),
            },
            headers=_NO_STORE,
        )

    def _request_problem(self, params: AuthorizeRequest) -> str | None:
        if not _same_secret(params.client_id, self._client_id):
            return "This application is not registered with Cairn's sign-in service."
        if problem := _redirect_uri_problem(params.redirect_uri, issuer_origin=self._issuer_origin):
            return problem
        if params.response_type != "code":
            return "Only the authorization code flow (response_type=code) is supported."
        if max(len(params.state), len(params.nonce), len(params.scope)) > MAX_PARAM_LENGTH:
            return "The sign-in request is too long."
        return None

    def _login_page(
        self,
        request: Request,
        params: AuthorizeRequest,
        *,
        status: int,
        error: _LoginRefused | None = None,
    ) -> HTMLResponse:
        # Keep an existing token so two open login tabs do not invalidate each other.
        token = request.cookies.get(CSRF_COOKIE, "")
        if not _CSRF_TOKEN_PATTERN.fullmatch(token):
            token = secrets.token_urlsafe(32)
        username = params.username if isinstance(params, LoginForm) else ""
        page = render_login_page(
            params,
            csrf_token=token,
            allow_signup=self._allow_signup,
            username=username,
            error=error.message if error else None,
        )
        headers = dict(PAGE_HEADERS)
        if error and error.retry_after:
            headers["Retry-After"] = str(error.retry_after)
        response = HTMLResponse(page, status, headers=headers)
        response.set_cookie(
            CSRF_COOKIE,
            token,
            max_age=CSRF_COOKIE_MAX_AGE,
            path=self._cookie_path,
            secure=self._secure_cookie,
            httponly=True,
            samesite="lax",
        )
        return response

    def _check_csrf(self, request: Request, form: LoginForm) -> None:
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not cookie or not form.csrf_token or not _same_secret(form.csrf_token, cookie):
            msg = "Your sign-in form expired or was sent from elsewhere. Please try again."
            raise _LoginRefused(400, msg)

    async def _authenticate(self, form: LoginForm, client_ip: str) -> Account:
        if form.mode == "signup" and self._allow_signup:
            return await self._sign_up(form, client_ip)
        if form.mode != "signin":
            raise _LoginRefused(400, "Choose Sign in.")
        try:
            attempt = await self._throttle.sign_in(form.username, client_ip)
        except Throttled as refused:
            raise _LoginRefused(429, str(refused), retry_after=refused.retry_after) from None
        account = await self._accounts.verify(form.username, form.password)
        if account is None:
            # One message for unknown users and wrong passwords alike.
            raise _LoginRefused(401, "Incorrect username or password.")
        await self._throttle.signed_in(attempt)
        return account

    async def _sign_up(self, form: LoginForm, client_ip: str) -> Account:
        try:
            await self._throttle.sign_up(client_ip)
            return await self._accounts.create(form.username, form.password)
        except Throttled as refused:
            raise _LoginRefused(429, str(refused), retry_after=refused.retry_after) from None
        except AccountError as error:
            raise _LoginRefused(400, str(error)) from error

    def _check_client(self, request: Request, form: TokenForm) -> None:
        client_id, client_secret = form.client_id, form.client_secret
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "basic":
            client_id, client_secret = _basic_credentials(value)
        id_ok = _same_secret(client_id, self._client_id)
        # Always run both comparisons so timing does not reveal which one failed.
        secret_ok = _same_secret(client_secret, self._client_secret)
        if not (id_ok and secret_ok):
            raise _OAuthError(401, "invalid_client", "Client authentication failed.")
        if form.client_id and not _same_secret(form.client_id, client_id):
            raise _OAuthError(400, "invalid_request", "Conflicting client_id values.")

    async def _redeem(self, form: TokenForm) -> tuple[Account, CodeGrant]:
        if form.grant_type != "authorization_code":
            raise _OAuthError(400, "unsupported_grant_type", "Only authorization_code.")
        if not form.code:
            raise _OAuthError(400, "invalid_request", "The code parameter is missing.")
        grant = await self._codes.redeem(_hash_code(form.code))
        # The code is burnt even if the checks below fail: a leaked code is then worthless.
        if (
            grant is None
            or grant.client_id != self._client_id
            or grant.redirect_uri != form.redirect_uri
        ):
            raise _OAuthError(400, "invalid_grant", "The code is invalid, used or expired.")
        account = await self._accounts.get_by_subject(grant.subject)
        if account is None:
            raise _OAuthError(400, "invalid_grant", "The account no longer exists.")
        return account, grant

    def _issue_tokens(self, account: Account, grant: CodeGrant) -> dict[str, Any]:
        now = int(self._clock())
        common = {
            "iss": self._issuer,
            "sub": account.subject,
            "aud": self._client_id,
            "iat": now,
            "exp": now + TOKEN_TTL_SECONDS,
        }
        access_claims = {
            **common,
            "scope": GRANTED_SCOPE,
            "client_id": self._client_id,
            "jti": secrets.token_urlsafe(16),
        }
        id_claims = {
            **common,
            "auth_time": now,
            "preferred_username": account.username,
            "name": account.display_name or account.username,
        }
        if grant.nonce:
            id_claims["nonce"] = grant.nonce
        return {
            "access_token": self._sign(access_claims, jwt_type=_ACCESS_JWT_TYPE),
            "token_type": "Bearer",
            "expires_in": TOKEN_TTL_SECONDS,
            "id_token": self._sign(id_claims, jwt_type="JWT"),
            "scope": GRANTED_SCOPE,
        }

    def _sign(self, claims: dict[str, Any], *, jwt_type: str) -> str:
        header = {"alg": _ALGORITHM, "kid": self._kid, "typ": jwt_type}
        return jwt.encode(header, claims, self._key, algorithms=[_ALGORITHM])

    def _verified_subject(self, token: str) -> str | None:
        """The subject of a valid access token from us, or None."""
        registry = JWTClaimsRegistry(
            now=lambda: int(self._clock()),
            iss={"essential": True, "value": self._issuer},
            aud={"essential": True, "value": self._client_id},
            sub={"essential": True},
            exp={"essential": True},
            scope={"essential": True},
        )
        try:
            # Pinning the algorithm rules out alg=none and HS256-with-public-key forgeries.
            decoded = jwt.decode(token, self._key, algorithms=[_ALGORITHM])
            registry.validate(decoded.claims)
        except (JoseError, ValueError):
            return None
        # An id_token is signed by the same key; only access tokens may read userinfo.
        if decoded.header.get("typ") != _ACCESS_JWT_TYPE:
            return None
        return str(decoded.claims["sub"])


def _hash_code(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def _basic_credentials(value: str) -> tuple[str, str]:
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except ValueError:  # binascii.Error and UnicodeDecodeError are both ValueErrors
        return "", ""
    client_id, _, client_secret = decoded.partition(":")
    # RFC 6749 2.3.1: both parts are form-urlencoded before being joined.
    return unquote_plus(client_id), unquote_plus(client_secret)


def _bearer_challenge(challenge: str) -> JSONResponse:
    return JSONResponse(
        {"error": "invalid_token"}, 401, headers={**_NO_STORE, "WWW-Authenticate": challenge}
    )


def _check_issuer(issuer: str) -> str:
    parts = urlsplit(issuer)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.query
        or parts.fragment
        or not parts.path.rstrip("/").endswith(ROUTER_PREFIX)
    ):
        msg = f"issuer must be this router's public URL, e.g. http://localhost:8000{ROUTER_PREFIX}"
        raise ValueError(msg)
    return issuer.rstrip("/")


def local_groups(entries: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """CAIRN_LOCAL_GROUPS ('name=group|group', comma separated) as username -> groups."""
    found: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        name, _, listed = entry.partition("=")
        groups = tuple(g.strip() for g in listed.split("|") if g.strip())
        if not name.strip() or not groups:
            msg = f"CAIRN_LOCAL_GROUPS entry {entry!r}: write 'name=group|group'"
            raise ValueError(msg)
        found[name.strip()] = groups
    return found


def build_local_oidc_router(
    *,
    accounts: LocalAccounts,
    pool: Pool | None,
    issuer: str,
    client_id: str,
    client_secret: str,
    signing_key_path: Path,
    allow_signup: bool,
    groups: Mapping[str, tuple[str, ...]] | None = None,
    code_store: CodeStore | None = None,
    attempt_counter: AttemptCounter | None = None,
    clock: Callable[[], float] = time.time,
) -> APIRouter:
    """Mount under the app at `/local-oidc`; `issuer` is that mount's public URL.

    The app passes `pool` (codes and sign-in attempts go to Postgres); unit tests pass
    `code_store`, `attempt_counter` and `clock`.
    """
    if code_store is None or attempt_counter is None:
        if pool is None:
            msg = "build_local_oidc_router needs a connection pool, or a code store and counter"
            raise ValueError(msg)
        code_store = code_store or PgCodeStore(pool)
        attempt_counter = attempt_counter or PgAttemptCounter(pool)
    if not client_id or not client_secret:
        msg = "The local OIDC provider needs a non-empty client_id and client_secret"
        raise ValueError(msg)
    provider = _Provider(
        accounts=accounts,
        codes=code_store,
        attempts=attempt_counter,
        key=load_or_create_signing_key(signing_key_path),
        issuer=_check_issuer(issuer),
        client_id=client_id,
        client_secret=client_secret,
        allow_signup=allow_signup,
        clock=clock,
        groups=groups,
    )
    router = APIRouter(prefix=ROUTER_PREFIX, tags=["local-oidc"])
    router.add_api_route("/.well-known/openid-configuration", provider.discovery, methods=["GET"])
    router.add_api_route("/jwks", provider.jwks, methods=["GET"])
    router.add_api_route("/authorize", provider.show_login, methods=["GET"])
    router.add_api_route("/authorize", provider.submit_login, methods=["POST"])
    router.add_api_route("/token", provider.token, methods=["POST"])
    router.add_api_route("/userinfo", provider.userinfo, methods=["GET"])
    return router
