"""A one-host federation: a SuperLink and one SuperNode per client as separate processes on loopback,
optionally with TLS and SuperNode authentication, and ``flwr run`` of a fedge config on it.

This is the local launcher behind ``fedge deploy`` and the deploy tests. On real machines the same
commands run on the server and on each device (docs/deploy.md); only the addresses change.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from fedge.config import RunConfig
from fedge.errors import FedgeError
from fedge.files import results

RoundCallback = Callable[[int, dict[str, Any]], None]
ROUND_POLL_SECONDS = 0.5  # how often a run's new metrics rows are looked for
APP_COMPONENTS = {"serverapp": "fedge.deploy.server_app:app", "clientapp": "fedge.deploy.client_app:app"}


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Tls:
    """TLS material: a CA, the SuperLink's certificate for localhost/127.0.0.1, and a folder of node keys."""

    ca: Path
    cert: Path
    key: Path
    keys: Path

    @classmethod
    def create(cls, folder: Path) -> Tls:
        """A fresh CA and server certificate (openssl) in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "server.conf"
        conf.write_text(
            "[req]\ndistinguished_name=dn\nreq_extensions=req_ext\nprompt=no\n[dn]\nCN=localhost\n"
            "[req_ext]\nsubjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n"
        )
        tls = cls(folder / "ca.crt", folder / "server.pem", folder / "server.key", folder / "keys")
        ca_key, csr = folder / "ca.key", folder / "server.csr"
        x509 = ["-days", "30", "-sha256"]
        for command in (
            ["openssl", "genrsa", "-out", ca_key, "2048"],
            ["openssl", "req", "-new", "-x509", "-key", ca_key, "-subj", "/CN=ca", *x509, "-out", tls.ca],
            ["openssl", "genrsa", "-out", tls.key, "2048"],
            ["openssl", "req", "-new", "-key", tls.key, "-out", csr, "-config", conf],
            ["openssl", "x509", "-req", "-in", csr, "-CA", tls.ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", tls.cert, *x509, "-extfile", conf, "-extensions", "req_ext"],
        ):  # fmt: skip
            subprocess.run([str(c) for c in command], check=True, capture_output=True)
        tls.keys.mkdir(exist_ok=True)
        return tls

    def node_key(self, name: str) -> Path:
        """A new OpenSSH ECDSA key pair for a SuperNode (the private key's path; ``.pub`` beside it)."""
        path = self.keys / name
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(path)], check=True
        )
        return path


@dataclass
class Federation:
    """SuperLink + SuperNodes on this host, each its own process, all stopped by :meth:`stop`."""

    home: Path
    tls: Tls | None = None
    port: int = field(default_factory=free_port)
    superlink: subprocess.Popen | None = None
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)
    apps: dict[str, subprocess.Popen] = field(default_factory=dict)  # the app process of each of them

    @property
    def connection(self) -> str:
        return "local-tls" if self.tls else "local-insecure"

    def env(self) -> dict[str, str]:
        """The environment of every Flower process: its own home, no telemetry, no update check."""
        env = dict(
            os.environ, FLWR_HOME=str(self.home), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1"
        )
        env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        return env

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = (self.home / "logs" / f"{name}.log").open("w")
        return subprocess.Popen(
            command, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start(self) -> Federation:
        """Start the SuperLink (TLS and node auth when ``tls``) and its long-lived ServerApp process, then
        write the connection settings."""
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        security = ["--insecure"]
        if self.tls:
            files = {"ca-certfile": self.tls.ca, "certfile": self.tls.cert, "keyfile": self.tls.key}
            security = [
                *(x for k, v in files.items() for x in (f"--ssl-{k}", str(v))),
                "--enable-supernode-auth",
            ]

        def command(port: int) -> list[str]:
            return ["flower-superlink", "--port", str(port), "--disable-runtime-dependency-installation",
                    "--isolation", "process", *security]  # fmt: skip

        self.superlink, self.port = self._spawn_listening("superlink", command, self.port)
        if self.superlink.poll() is not None:
            raise FedgeError(f"the SuperLink exited ({self._log('superlink')})")
        ca = self.tls.ca if self.tls else None  # a SuperLink with TLS serves its Runtime API over TLS
        self._spawn_app("superlink", "serverapp", self.superlink, self.port, ca)
        link: dict[str, object] = {"address": f"127.0.0.1:{self.port}"}
        link.update({"root-certificates": str(self.tls.ca)} if self.tls else {"insecure": True})
        settings = {"superlink": {"default": self.connection, self.connection: link}}
        (self.home / "config.toml").write_text(tomli_w.dumps(settings))
        return self

    def _spawn_listening(
        self, name: str, command: Callable[[int], list[str]], port: int, tries: int = 3
    ) -> tuple[subprocess.Popen, int]:
        """Start ``command(port)`` and wait until it listens on ``port`` or exits.

        A free port can be taken between choosing it and the process binding it (another process
        starting at the same moment); a process that exits on "address already in use" is started
        again on a fresh port. Any other exit is returned as it is (a node refused by the SuperLink)."""
        for _ in range(tries):
            process = self._spawn(name, command(port))
            if self._wait_listening(name, process, port) or not self._port_taken(name):
                return process, port
            port = free_port()
        raise FedgeError(f"{name} found its port taken {tries} times ({self._log(name)})")

    def _log(self, name: str) -> Path:
        return self.home / "logs" / f"{name}.log"

    def _port_taken(self, name: str) -> bool:
        return "address already in use" in self._log(name).read_text().lower()

    def _wait_listening(self, name: str, process: subprocess.Popen, port: int, timeout: float = 60.0) -> bool:
        """True once the process logs that it serves on ``port`` (its web server's line, so a port some
        other process holds does not count); False if it exited first."""
        serving = [f"running on {scheme}://127.0.0.1:{port}" for scheme in ("http", "https")]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line in self._log(name).read_text() for line in serving):
                return True
            if process.poll() is not None:
                return False
            time.sleep(0.2)
        raise FedgeError(f"{name} did not serve on port {port} within {timeout:.0f} s ({self._log(name)})")

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """A ``flwr`` CLI command against this federation."""
        return subprocess.run(
            ["flwr", *args], env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def register(self, key: Path, name: str) -> None:
        """Register a SuperNode's public key with the SuperLink (node authentication)."""
        done = self.flwr("supernode", "register", f"{key}.pub", self.connection, "--name", name)
        if done.returncode != 0:
            raise FedgeError(f"registering {name} failed: {done.stdout}{done.stderr}")

    def add_node(
        self, client: int, num_clients: int, key: Path | None = None, name: str | None = None
    ) -> subprocess.Popen:
        """Start the SuperNode of client ``client`` (with its private ``key`` under TLS + auth) and its
        long-lived ClientApp process."""
        name = name or f"node{client}"
        security = ["--root-certificates", str(self.tls.ca)] if self.tls else ["--insecure"]
        if self.tls and key is not None:
            security += ["--auth-supernode-private-key", str(key)]

        def command(port: int) -> list[str]:
            partition = f"partition-id={client} num-partitions={num_clients}"
            return ["flower-supernode", "--superlink", f"127.0.0.1:{self.port}", "--port", str(port),
                    "--node-config", partition, "--isolation", "process", *security]  # fmt: skip

        node, port = self._spawn_listening(name, command, free_port())
        self.nodes[name] = node
        self._spawn_app(name, "clientapp", node, port)
        return node

    def _spawn_app(
        self, name: str, kind: str, parent: subprocess.Popen, port: int, ca: Path | None = None
    ) -> None:
        """Start the long-lived app process (:mod:`fedge.deploy.app_process`) of process ``name``, which
        serves its Runtime API on ``port`` (over TLS with a certificate of ``ca``) and exits with it."""
        command = [sys.executable, "-m", "fedge.deploy.app_process", kind,
                   "--runtime-api-address", f"127.0.0.1:{port}", "--parent-pid", str(parent.pid)]  # fmt: skip
        if ca is not None:
            command += ["--root-certificates", str(ca)]
        self.apps[name] = self._spawn(f"{name}-{kind}", command)

    def kill_node(self, name: str) -> None:
        """Kill a SuperNode and everything it started (its ClientApp process included)."""
        for process in (self.nodes[name], self.apps.pop(name)):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def run(self, config: RunConfig, round_timeout: float = 120.0, join_timeout: float = 120.0,
            timeout: float = 1800.0, on_round: RoundCallback | None = None) -> Path:  # fmt: skip
        """Run ``config`` on the federation with ``flwr run``; the run directory once it finished.
        ``on_round(t, row)`` gets each round's metrics row as the server app writes it."""
        out = Path(config.output.dir).resolve()
        config = config.model_copy(update={"output": config.output.model_copy(update={"dir": str(out)})})
        rounds = NewRows(out, on_round)
        app = self.home / "app"
        app.mkdir(exist_ok=True)
        (app / "pyproject.toml").write_text(tomli_w.dumps(app_project(config, round_timeout, join_timeout)))
        log = self.home / "logs" / "flwr-run.log"
        with log.open("w") as sink:
            command = ["flwr", "run", str(app), self.connection, "--stream"]
            done = subprocess.Popen(command, env=self.env(), stdout=sink, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout
            while done.poll() is None and time.monotonic() < deadline:
                rounds.read()
                time.sleep(ROUND_POLL_SECONDS)
            if done.poll() is None:
                done.kill()
                done.wait()
                raise FedgeError(f"the deployed run took over {timeout:.0f} s (logs: {self.home / 'logs'})")
        rounds.read()
        status = self.flwr("ls", self.connection, "--format", "json")
        runs = json.loads(status.stdout).get("runs", []) if status.returncode == 0 else []
        if done.returncode != 0 or not runs or "completed" not in str(runs[-1].get("status", "")):
            server = self._log("superlink-serverapp")  # the server app's log: its traceback, if it raised
            tail = (server.read_text() if server.is_file() else log.read_text())[-2000:]
            raise FedgeError(f"the deployed run failed (logs: {self.home / 'logs'}): {tail}")
        return rounds.run_dir()

    def stop(self) -> None:
        """Stop every process this federation started (SIGTERM, then SIGKILL after 10 s)."""
        processes = [
            *self.apps.values(),
            *self.nodes.values(),
            *([self.superlink] if self.superlink else []),
        ]
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NewRows:
    """The run directory a deployed run makes under ``out`` (the one that was not there before) and the
    metrics rows it has written so far, each handed once to ``on_round(t, row)``."""

    def __init__(self, out: Path, on_round: RoundCallback | None = None):
        self.out, self.on_round = out, on_round
        self.before = set(out.glob("*")) if out.is_dir() else set()
        self.seen = 0

    def made(self) -> list[Path]:
        return [p for p in self.out.glob("*") if p not in self.before and p.is_dir()]

    def run_dir(self) -> Path:
        """The one new run directory (a FedgeError if there is none or several)."""
        made = self.made()
        if len(made) != 1:
            raise FedgeError(f"expected one new run directory in {self.out}, found {len(made)}")
        return made[0]

    def read(self) -> None:
        """Hand the rows written since the last call to ``on_round``."""
        made = self.made()
        if self.on_round is None or len(made) != 1 or not (made[0] / results.METRICS).is_file():
            return
        rows = results.read_jsonl(made[0] / results.METRICS)  # written whole each round (temp + rename)
        for row in rows[self.seen :]:
            self.on_round(int(row["round"]), row)
        self.seen = max(self.seen, len(rows))


def app_project(config: RunConfig, round_timeout: float, join_timeout: float) -> dict:
    """The Flower app's pyproject.toml: fedge's ServerApp and ClientApp, with the config as YAML text."""
    return {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "fedge-run", "version": "1.0.0", "dependencies": ["flwr>=1.41"]},
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "fedge",
                    "components": APP_COMPONENTS,
                    "config": {
                        "config": config.to_yaml(),
                        "round-timeout": float(round_timeout),
                        "join-timeout": float(join_timeout),
                    },
                }
            }
        },
    }
