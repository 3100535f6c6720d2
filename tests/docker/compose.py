"""One docker-compose project of the repository's docker-compose.yml, published on loopback.

Each test module runs its own project name, so ``down -v`` removes exactly what it created, and
what is left afterwards can be listed by the project's label.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from tests.docker.engine import REPO, Engine
from tests.support.procs import free_port


@dataclass
class Project:
    engine: Engine
    name: str
    env: dict[str, str]
    files: tuple[str, ...] = ("-f", "docker-compose.yml")  # docker-compose's file arguments
    started: float = 0.0  # monotonic time of `up`, for the figures

    @classmethod
    def create(cls, engine: Engine, name: str, env: dict[str, str]) -> Project:
        gateway, prometheus = free_port(), free_port()
        env = {**env, "FLEET_PUBLISH": f"127.0.0.1:{gateway}", "PROMETHEUS_PUBLISH": f"127.0.0.1:{prometheus}"}
        return cls(engine, name, env)

    @property
    def gateway(self) -> str:
        return "http://" + self.env["FLEET_PUBLISH"]

    @property
    def prometheus(self) -> str:
        return "http://" + self.env["PROMETHEUS_PUBLISH"]

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["/usr/bin/docker-compose", *self.files, "-p", self.name, *args]
        done = subprocess.run(cmd, env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done

    def timed(self, *args: str, timeout: float = 600) -> float:
        start = time.monotonic()
        self.compose(*args, timeout=timeout)
        return time.monotonic() - start

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes that carry this project's label."""
        label = f"label=com.docker.compose.project={self.name}"
        out: list[str] = []
        for kind in ("container ls -a", "network ls", "volume ls"):
            done = self.engine.docker(*kind.split(), "-q", "--filter", label)
            out += [f"{kind.split()[0]} {line}" for line in done.stdout.split()]
        return out

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "30", check=False, timeout=300)

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "80", check=False, timeout=60).stdout
