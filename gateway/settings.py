"""Gateway settings: defaults < the config file's ``gateway:`` section < ``FLEET_*`` variables."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


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

    log_level: str = "info"
    access_log: bool = False

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

    def keys(self) -> tuple[bytes, ...]:
        """Every accepted client key, as bytes for constant-time comparison."""
        found = [k.strip() for k in self.api_keys.split(",")]
        if self.api_keys_file:
            with open(self.api_keys_file, encoding="utf-8") as f:
                found += [ln.split("#", 1)[0].strip() for ln in f]
        return tuple(k.encode() for k in found if k)


def load_settings(file_values: dict[str, Any]) -> GatewaySettings:
    return GatewaySettings(**file_values)
