"""The upstream side of the hot path: the shared aiohttp session and parsed backend URLs."""

from __future__ import annotations

import aiohttp
from yarl import URL

from gateway.settings import GatewaySettings

_MAX_URLS = 1024


def open_session(settings: GatewaySettings) -> aiohttp.ClientSession:
    # No pool limit: backpressure is the limiter's job, not a hidden connector queue.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,  # relay bytes exactly as the upstream sent them
        timeout=aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s),
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
        cookie_jar=aiohttp.DummyCookieJar(),  # a proxy keeps no cookies between clients
    )


class UrlCache:
    """Parsed upstream URLs by (backend URL, path): parsing one per request shows on the hot path.
    Bounded, because the path comes from the client."""

    def __init__(self) -> None:
        self._urls: dict[tuple[str, str], URL] = {}

    def get(self, base: str, target: str) -> URL:
        key = (base, target)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= _MAX_URLS:
                self._urls.clear()
            url = self._urls[key] = URL(base + target)
        return url
