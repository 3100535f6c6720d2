"""Gateway settings: defaults < the config file's ``gateway:`` section < ``FLEET_*`` variables."""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fleetspec.errors import ConfigError, key_path
from fleetspec.policies import SCRAPING, Policy

MAX_WORKERS = 256


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_", extra="ignore")

    host: str = Field("0.0.0.0", description="address the gateway listens on")
    port: int = Field(8080, ge=0, le=65535, description="port the gateway listens on")
    api_keys: str = Field("", description="comma-separated client keys (Authorization: Bearer KEY); unset: no auth")
    api_keys_file: str | None = Field(None, description="file with one key per line (# comments), added to "
                                      "FLEET_API_KEYS")
    public_models: bool = Field(True, description="GET /v1/models needs no key (the Infernet daemon probes it "
                                "without one)")
    protect_metrics: bool = Field(False, description="require a key for /metrics and /fleet too")
    console: bool = Field(True, description="serve the web console at /ui (docs/console.md); its data needs a key "
                          "when keys are set, its logs and controls the admin key")
    console_prompts: bool = Field(False, description="the console's Activity shows the first 200 characters of each "
                                  "request's last message (to admin keys only); off: no prompt text is kept")
    upstream_api_key: str | None = Field(None, description="key sent to backends started with vLLM's --api-key")

    health_interval_s: float = Field(5.0, gt=0, description="seconds between active /health probes of each backend")
    health_timeout_s: float = Field(2.0, gt=0, description="deadline of one probe")
    health_failures: int = Field(3, ge=1, description="failed probes in a row before a backend leaves rotation")
    health_successes: int = Field(2, ge=1, description="good probes in a row before it returns")

    upstream_warm: bool = Field(False, description="hold each backend's share of its concurrency limit in open "
                                "connections, opened before requests need them; needs backends that keep idle "
                                "connections longer than FLEET_HEALTH_INTERVAL_S (`vllm-fleet up` turns it on and sets "
                                "its vLLMs' VLLM_HTTP_TIMEOUT_KEEP_ALIVE; docs/gateway.md#warm-upstream-connections)")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="request bodies above this get 413")
    connect_timeout_s: float = Field(5.0, gt=0, description="TCP connect to a backend")
    # Queueing and prefill of a long prompt happen before vLLM sends headers: keep this long.
    headers_timeout_s: float = Field(600.0, gt=0, description="request sent → response headers (queueing and "
                                     "prefill happen here, so it is long)")
    idle_timeout_s: float = Field(300.0, gt=0, description="longest silence between two response chunks")
    max_attempts: int = Field(3, ge=1, description="tries over different replicas, only before any response byte")
    # Long: generations are long.
    total_timeout_s: float = Field(3600.0, ge=0, description="hard bound on a whole request, streaming included; "
                                   "0 = off")
    max_migrations: int = Field(2, ge=0, le=8, description="a stream whose replica breaks after its first byte "
                                "continues on another replica at most this many times "
                                "(docs/stream-failover.md); 0 = never (an error event, as before)")
    # Full-jitter exponential backoff between tries (tenacity), base doubling to max.
    retry_deadline_s: float = Field(10.0, ge=0, description="no retry starts later than this after the request "
                                    "arrived (pause and queueing included); 0 = no retries")
    retry_backoff_base_s: float = Field(0.05, ge=0, description="pause before retry n: random in [0, base × 2^(n−1)]")
    retry_backoff_max_s: float = Field(1.0, ge=0, description="cap of that pause")

    eject_failures: int = Field(3, ge=1, description="failed requests in a row (connect error, reset, timeout, "
                                "mid-stream failure, 502/503/504) that eject a backend from rotation")
    eject_base_s: float = Field(5.0, gt=0, description="first ejection period; doubles for repeat ejections")
    eject_max_s: float = Field(300.0, gt=0, description="longest ejection period")

    # Backpressure: with several workers the limits and the queue are the whole gateway's (gateway/shared.py).
    backend_max_concurrency: int | None = Field(
        None, ge=0, description="requests open to one backend at once; 0 = no limit; unset: the backend's own vLLM "
        "--max-num-seqs, which vllm-fleet up writes into the Infernet JSON (else no limit)")
    backend_queue: int = Field(512, ge=0, description="waiting places per replica in a model's FIFO when all its "
                               "replicas are full")
    queue_timeout_s: float = Field(30.0, gt=0, description="longest wait in that queue before a 429")
    max_in_flight: int = Field(4096, ge=1, description="requests inside the gateway at once, queued ones included; "
                               "beyond it 429")
    # A cold start of a big model takes minutes.
    wake_timeout_s: float = Field(300.0, gt=0, description="how long a request for a model whose instances sleep "
                                  "waits for one to wake (within FLEET_TOTAL_TIMEOUT_S)")
    admin_keys: str = Field("", description="comma-separated keys for /admin/* (sleep, wake, restart an instance); "
                            "unset: admin endpoints refused. `vllm-fleet up` makes one if none is set")
    # Unset: the gateway serves on its own probes alone.
    supervisor_url: str | None = Field(None, description="the supervisor's control channel (sleep and wake, instance "
                                       "states); set by `vllm-fleet up` for the gateway it starts")
    control_token: str | None = Field(None, description="token for that channel; set by `vllm-fleet up`")

    max_tokens_cap: int | None = Field(None, ge=1, description="largest accepted max_tokens / "
                                       "max_completion_tokens; larger → 400; unset: no cap")
    max_n_cap: int | None = Field(None, ge=1, description="largest accepted n; larger → 400; unset: no cap")

    routing_policy: Policy = Field(Policy.LEAST_IN_FLIGHT, description="every model's routing policy "
                                   "(docs/gateway.md#routing-policies)")
    routing_policies: dict[str, Policy] = Field(
        default_factory=dict, description='per-model policies as JSON, {"qwen2.5:72b": "prefix_aware"}; merged per '
        "model with the file's gateway.routing_policies")
    load_scrape_interval_s: float = Field(1.0, gt=0, description="load_aware / prefix_aware: how often each "
                                          "backend's /metrics is read; a scrape older than 3 intervals is ignored")
    affinity_header: str = Field("x-session-id", description="prefix_aware: the request header that names a session "
                                 "(else the body's user)")
    affinity_load_factor: float = Field(1.25, ge=1.0, description="prefix_aware: an affinity replica is passed over "
                                        "when it would hold more than this × the average load")
    prefix_index_blocks: int = Field(200_000, ge=1, description="prefix_aware: prompt blocks (128 characters each) "
                                     "remembered per model, least recently used out; with several workers "
                                     "the size of their shared table, for all models")

    log_level: str = Field("info", description="log level: debug, info, warning, error")
    access_log: bool = Field(False, description="log every request (uvicorn's access log)")

    # Each worker keeps its own pool, probes and limiter; metrics are summed across them.
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="gateway processes serving the one port; also "
                         "--workers N (wins) and gateway.workers (docs/gateway.md#several-gateway-workers)")

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

    def admin(self) -> tuple[bytes, ...]:
        return tuple(k.strip().encode() for k in self.admin_keys.split(",") if k.strip())

    def keys(self) -> tuple[bytes, ...]:
        """Every accepted client key, as bytes for constant-time comparison."""
        found = [k.strip() for k in self.api_keys.split(",")]
        if self.api_keys_file:
            with open(self.api_keys_file, encoding="utf-8") as f:
                found += [ln.split("#", 1)[0].strip() for ln in f]
        return tuple(k.encode() for k in found if k)


def load_settings(file_values: dict[str, Any], source: str = "the config file") -> GatewaySettings:
    """Settings from the file's values and the environment; a bad value is a ConfigError (exit 2)
    naming the variable, the file key it could have come from, where it did come from, and the fix."""
    try:
        return GatewaySettings(**file_values)
    except ValidationError as e:
        env = {k.upper() for k in os.environ}
        prefix = str(GatewaySettings.model_config.get("env_prefix", ""))
        lines = []
        for err in e.errors():
            key = key_path(err["loc"])
            top = str(err["loc"][0]) if err["loc"] else key
            var = f"{prefix}{top.upper()}"
            given = f"got {err['input']!r} " if isinstance(err["input"], str | int | float | bool) else ""
            fix = (f"{given}from the environment: fix or unset {var}" if var in env else
                   f"{given}from {source}: fix gateway.{top} there")
            lines.append(f"  {var} (gateway.{key}): {err['msg']}; {fix}")
        raise ConfigError(f"invalid gateway settings ({prefix}* variables over {source})\n" + "\n".join(lines)) from e
