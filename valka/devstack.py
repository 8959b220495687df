"""`make run`: the whole local stack in one command.

Starts (or reuses) the project-local PostgreSQL cluster unless DATABASE_URL
is set, applies migrations, creates a local admin account (local cluster
only), then runs the web app and every other process of the stack until
Ctrl-C.

Everything listens on 127.0.0.1 only: the stack allows anonymous API calls and its dispatcher
takes workers without a credential, which is fine on loopback and nowhere else.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from valka import devdb

WEB_ADDR = ("127.0.0.1", 8989)
GRPC_PORT = 50051
ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin"
# The local stack is for trying things out: open API, plain HTTP on loopback (even when the
# shell exported a SECRET_KEY, which turns on the HTTPS-only production defaults), and the
# development SECRET_KEY when the shell has none.
LOCAL_ENV = {
    "VALKA_API_ANONYMOUS": "true",
    "VALKA_DEVELOPMENT": "true",
    "SESSION_COOKIE_SECURE": "false",
    "CSRF_COOKIE_SECURE": "false",
    "SECURE_SSL_REDIRECT": "false",
    "SECURE_HSTS_SECONDS": "0",
    "PYTHONUNBUFFERED": "1",
}


def grpc_port(env: dict[str, str]) -> int:
    """The dispatcher's port: VALKA_GRPC_ADDR's when the shell set one (its host is not used:
    the local dispatcher listens on 127.0.0.1 only), else 50051."""
    addr = env.get("VALKA_GRPC_ADDR", "")
    port = addr.rsplit(":", 1)[-1] if ":" in addr else ""
    return int(port) if port.isdigit() else GRPC_PORT


def _processes(py: str, grpc_port: int = GRPC_PORT) -> dict[str, list[str]]:
    host, port = WEB_ADDR
    procs = {
        "web": [py, "-m", "uvicorn", "valka.asgi:application", "--host", host, "--port", str(port),
                "--no-access-log"],
    }
    root = Path(__file__).resolve().parent.parent
    if (root / "dispatcher" / "management" / "commands" / "run_dispatcher.py").exists():
        procs["dispatcher"] = [py, "manage.py", "run_dispatcher", "--addr", f"{host}:{grpc_port}"]
    if (root / "tasks" / "management" / "commands" / "run_scheduler.py").exists():
        procs["scheduler"] = [py, "manage.py", "run_scheduler"]
    if (root / "examples" / "worker.py").exists():
        procs["worker"] = [py, "examples/worker.py"]
    if (root / "examples" / "progress_worker.py").exists():
        procs["progress-worker"] = [py, "examples/progress_worker.py"]
    return procs


def _wait_listening(addrs: list[tuple[str, int]], children: dict[str, subprocess.Popen[bytes]],
                    timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for host, port in addrs:
        while time.monotonic() < deadline and all(p.poll() is None for p in children.values()):
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex((host, port)) == 0:
                    break
            time.sleep(0.1)


def main() -> int:
    py = sys.executable
    env = dict(os.environ)
    local = not env.get("DATABASE_URL")
    if local:
        cluster = devdb.Cluster(Path(devdb.DEFAULT_DIR), int(env.get("VALKA_PG_PORT", devdb.DEFAULT_PORT)))
        try:
            cluster.start()
        except devdb.DevDBError as exc:
            print(f"make run: {exc}", file=sys.stderr)
            return 1
        env["DATABASE_URL"] = cluster.url
    for name, value in LOCAL_ENV.items():
        env.setdefault(name, value)
    port = grpc_port(env)
    env.setdefault("VALKA_WORKER_SERVER", f"127.0.0.1:{port}")  # the example workers' dispatcher
    subprocess.run([py, "manage.py", "migrate", "--no-input", "-v", "0"], env=env, check=True)
    if local:
        subprocess.run([py, "manage.py", "ensure_local_admin", ADMIN_USER, ADMIN_PASSWORD], env=env, check=True)

    children: dict[str, subprocess.Popen[bytes]] = {}
    processes = _processes(py, port)
    servers = {name: cmd for name, cmd in processes.items() if "worker" not in name}
    for name, cmd in servers.items():
        children[name] = subprocess.Popen(cmd, env=env)
    # Workers start once the dispatcher answers, so their first connection succeeds.
    _wait_listening([WEB_ADDR, ("127.0.0.1", port)] if "dispatcher" in children else [WEB_ADDR], children)
    for name, cmd in processes.items():
        if name not in servers:
            children[name] = subprocess.Popen(cmd, env=env)
    host, port = WEB_ADDR
    print(f"\nValka is up: REST API http://{host}:{port}/api/v1/  docs http://{host}:{port}/api/docs/", flush=True)
    print(f"Admin: http://{host}:{port}/admin/", end="")
    print(f"  (user {ADMIN_USER!r}, password {ADMIN_PASSWORD!r})" if local else "", flush=True)
    print(f"Processes: {', '.join(children)}. Press Ctrl-C to stop.\n", flush=True)

    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    while not stopping:
        for name, proc in children.items():
            if proc.poll() is not None:
                print(f"make run: {name} exited with {proc.returncode}; stopping the stack", file=sys.stderr)
                code = proc.returncode or 1
                stopping = True
                break
        time.sleep(0.3)
    for proc in children.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in children.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    return code


if __name__ == "__main__":
    sys.exit(main())
