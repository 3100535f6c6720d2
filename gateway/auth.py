"""Client and admin API keys: ``Authorization: Bearer <key>``, compared in constant time.

Client keys open the API; admin keys open everything, ``/admin/*`` included, which client keys
never do (sleeping, waking and restarting instances is the operator's, not a client's)."""

from __future__ import annotations

import hmac

from starlette.types import Scope

ALWAYS_PUBLIC = frozenset({"/health", "/ready"})
ADMIN_PREFIX = "/admin/"
# The console's shell (HTML, JS, CSS) carries no data: public, so the page can ask for a key.
CONSOLE_SHELL = "/ui"
CONSOLE_STATIC = "/ui/static/"


def _match(token: bytes, keys: tuple[bytes, ...]) -> bool:
    # Compare against every key, so the time taken says nothing about which one was close.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(token, key)
    return ok


def bearer(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""


class KeyCheck:
    def __init__(self, keys: tuple[bytes, ...], public_models: bool, protect_metrics: bool,
                 admin_keys: tuple[bytes, ...] = (), console: bool = False) -> None:
        self.keys = keys
        self.console = console
        self.admin_keys = admin_keys
        public = set(ALWAYS_PUBLIC)
        if public_models:
            public.add("/v1/models")
        if not protect_metrics:
            public |= {"/metrics", "/fleet"}
        self.public = frozenset(public)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def is_admin(self, scope: Scope) -> bool:
        return bool(self.admin_keys) and _match(bearer(scope), self.admin_keys)

    def allows(self, scope: Scope) -> bool:
        """Decided on ``scope["path"]``, the same path the router dispatches on."""
        path = scope["path"]
        if path.startswith(ADMIN_PREFIX):
            return bool(self.admin_keys) and _match(bearer(scope), self.admin_keys)
        if not self.keys or path in self.public:
            return True
        if self.console and (path.rstrip("/") == CONSOLE_SHELL or path.startswith(CONSOLE_STATIC)):
            return True
        token = bearer(scope)
        return _match(token, self.keys) or (bool(self.admin_keys) and _match(token, self.admin_keys))
