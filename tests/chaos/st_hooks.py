"""schemathesis hooks for tests/chaos/test_fuzz.py, loaded with SCHEMATHESIS_HOOKS=tests.chaos.st_hooks.

The one check: no 5xx produced by the gateway itself. A 5xx that a backend produced carries
``x-fleet-backend`` (the gateway relays it, by design); any other 5xx is the gateway's own.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def not_a_gateway_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code >= 500 and "x-fleet-backend" not in response.headers:
        raise AssertionError(f"the gateway itself answered {response.status_code}: {response.text[:300]}")
    return None
