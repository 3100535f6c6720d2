"""Client API keys: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.types import Scope

ALWAYS_PUBLIC = frozenset({"/health", "/ready"})


class KeyCheck:
    def __init__(self, keys: tuple[bytes, ...], public_models: bool, protect_metrics: bool) -> None:
        self.keys = keys
        public = set(ALWAYS_PUBLIC)
        if public_models:
            public.add("/v1/models")
        if not protect_metrics:
            public |= {"/metrics", "/fleet"}
        self.public = frozenset(public)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def allows(self, scope: Scope) -> bool:
        """Decided on ``scope["path"]``, the same path the router dispatches on."""
        if not self.keys or scope["path"] in self.public:
            return True
        token = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    token = b""
                break
        # Compare against every key, so the time taken says nothing about which one was close.
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token.strip(), key)
        return ok
