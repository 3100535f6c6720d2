"""Gateway settings: defaults < the config file's ``gateway:`` section < ``FLEET_*`` variables."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fleetspec.errors import ConfigError, key_path
from fleetspec.policies import SCRAPING, Policy

MAX_WORKERS = 256


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_", extra="ignore")

    host: str = "0.0.0.0"
    port: int = Field(8080, ge=0, le=65535)
    api_keys: str = ""  # comma-separated; empty means no auth
    api_keys_file: str | None = None  # one key per line, '#' comments; added to api_keys
    public_models: bool = True  # the Infernet daemon probes /v1/models with no auth header
    protect_metrics: bool = False  # require a key for /metrics and /fleet too
    upstream_api_key: str | None = None  # sent to backends started with vLLM's --api-key

    health_interval_s: float = Field(5.0, gt=0)
    health_timeout_s: float = Field(2.0, gt=0)
    health_failures: int = Field(3, ge=1)
    health_successes: int = Field(2, ge=1)

    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    connect_timeout_s: float = Field(5.0, gt=0)
    # Queueing and prefill of a long prompt happen before vLLM sends headers: keep this long.
    headers_timeout_s: float = Field(600.0, gt=0)
    idle_timeout_s: float = Field(300.0, gt=0)  # longest silence between two chunks
    max_attempts: int = Field(3, ge=1)  # tries over different replicas, only before any byte
    # Hard bound on a whole request, streaming included; 0 turns it off. Long: generations are long.
    total_timeout_s: float = Field(3600.0, ge=0)
    # Retries start only within this long of the request's arrival; it bounds backoff and queueing
    # for a retry too. Full-jitter exponential backoff between tries (tenacity), base doubling to max.
    retry_deadline_s: float = Field(10.0, ge=0)
    retry_backoff_base_s: float = Field(0.05, ge=0)
    retry_backoff_max_s: float = Field(1.0, ge=0)

    # Passive ejection: this many failed requests in a row (connect error, reset, timeout, 502/503/504)
    # take a backend out of rotation for eject_base_s, doubling per repeat up to eject_max_s.
    eject_failures: int = Field(3, ge=1)
    eject_base_s: float = Field(5.0, gt=0)
    eject_max_s: float = Field(300.0, gt=0)

    # Backpressure. A replica takes at most backend_max_concurrency requests (0 = no limit); when every
    # replica of a model is full, requests wait in a FIFO of backend_queue places per replica, at most
    # queue_timeout_s. max_in_flight caps the gateway as a whole (queued requests included).
    backend_max_concurrency: int = Field(256, ge=0)
    backend_queue: int = Field(512, ge=0)
    queue_timeout_s: float = Field(30.0, gt=0)
    max_in_flight: int = Field(4096, ge=1)

    # Request caps (None = no cap): larger max_tokens / max_completion_tokens or n get a 400.
    max_tokens_cap: int | None = Field(None, ge=1)
    max_n_cap: int | None = Field(None, ge=1)

    # Routing (gateway/routing.py): the policy of every model, and per-model exceptions
    # ({"model": "prefix_aware"}; as a variable, JSON).
    routing_policy: Policy = Policy.LEAST_IN_FLIGHT
    routing_policies: dict[str, Policy] = Field(default_factory=dict)
    # Load-aware and prefix-aware read each backend's /metrics this often.
    load_scrape_interval_s: float = Field(1.0, gt=0)
    # Prefix-aware: the header naming a session (else the body's "user"); how far above the average
    # load an affinity replica may be and still be chosen; how many prompt blocks each model remembers.
    affinity_header: str = "x-session-id"
    affinity_load_factor: float = Field(1.25, ge=1.0)
    prefix_index_blocks: int = Field(200_000, ge=1)

    log_level: str = "info"
    access_log: bool = False

    # Server processes sharing the listening socket. Each keeps its own pool, probes and limiter
    # (gateway/workers.py divides the limits above among them); metrics are summed across them.
    workers: int = Field(1, ge=1, le=MAX_WORKERS)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init kwargs carry the config file's values; the environment must win over them.
        return env_settings, init_settings

    @property
    def retry_after(self) -> str:
        """Retry-After of a 503: about one probe interval, the soonest a backend can come back."""
        return str(max(1, round(self.health_interval_s)))

    def policy_of(self, model: str) -> Policy:
        return self.routing_policies.get(model, self.routing_policy)

    @property
    def scrapes_load(self) -> bool:
        """Some model's policy reads the backends' /metrics."""
        return any(p in SCRAPING for p in (self.routing_policy, *self.routing_policies.values()))

    def keys(self) -> tuple[bytes, ...]:
        """Every accepted client key, as bytes for constant-time comparison."""
        found = [k.strip() for k in self.api_keys.split(",")]
        if self.api_keys_file:
            with open(self.api_keys_file, encoding="utf-8") as f:
                found += [ln.split("#", 1)[0].strip() for ln in f]
        return tuple(k.encode() for k in found if k)


def load_settings(file_values: dict[str, Any]) -> GatewaySettings:
    """Settings from the file's values and the environment; a bad value is a ConfigError (exit 2)
    naming the variable and the file key it could have come from."""
    try:
        return GatewaySettings(**file_values)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = key_path(err["loc"])
            top = str(err["loc"][0]) if err["loc"] else key
            lines.append(f"  FLEET_{top.upper()} (gateway.{key}): {err['msg']}")
        raise ConfigError("invalid gateway settings\n" + "\n".join(lines)) from e
