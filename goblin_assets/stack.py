"""The scaled-out stack on one machine: PostgreSQL, Redis and Celery workers in a temporary directory, on loopback.

What ``make stack``, ``tests/test_scale_out.py`` and ``benchmarks/scale_out.py`` start.  Nothing here
schedules work: PostgreSQL holds the Dagster instance (``dagster-postgres``) and the DuckLake catalog,
Redis is the Celery broker and result backend, and the workers are ``dagster-celery``'s own
(``dagster-celery worker start``).  Dagster's celery executor sends each step of a run to them.

PostgreSQL refuses to run as root: when this process is root, ``initdb``, ``pg_ctl`` and the server run
as the ``postgres`` user (``runuser -u postgres``; the Debian package creates it) and the data directory
is chowned to it.  Every process started here is stopped by :meth:`Stack.stop` (also when starting
fails half-way); the servers are started with ``start_new_session`` so a stop reaches their children.

Layout under ``root``: ``pg/`` (the cluster; as root, a ``goblin-pg-*`` folder of its own in the temporary
directory, owned by ``postgres``, removed on stop), ``redis/``, ``dagster/dagster.yaml`` (the instance),
``celery.yaml`` (the workers' broker), ``lake/`` (DuckLake's Parquet files), ``logs/``.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Databases created in the cluster: the Dagster instance's storage and the DuckLake catalog.
DAGSTER_DB, CATALOG_DB = "dagster", "ducklake"
PG_USER = "goblin"


class StackError(RuntimeError):
    """A server or worker did not start (message carries its log's tail)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin(name: str) -> str:
    """Path of a PostgreSQL server program (Debian keeps them under /usr/lib/postgresql/<v>/bin)."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise StackError(f"{name} not found: install Debian's postgresql (make system-deps)")
    return found


def missing_servers() -> list[str]:
    """The server programs this machine lacks (empty: the stack can start)."""
    out = []
    for name in ("initdb", "pg_ctl"):
        try:
            pg_bin(name)
        except StackError:
            out.append(name)
    if not shutil.which("redis-server"):
        out.append("redis-server")
    if os.geteuid() == 0:
        try:
            import pwd
            pwd.getpwnam("postgres")
        except KeyError:
            out.append("the postgres user (root cannot run PostgreSQL)")
    return out


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@dataclass
class Stack:
    """A running stack; :meth:`env` is what a Dagster process or ``goblin sql`` needs to use it."""

    root: Path
    pg_port: int = 0
    redis_port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)
    workers: list[subprocess.Popen] = field(default_factory=list)
    pg_started: bool = False
    pg_dir: Path | None = None

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    def dsn(self, db: str) -> str:
        return f"host=127.0.0.1 port={self.pg_port} user={PG_USER} dbname={db}"

    @property
    def broker(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default os.environ) with the warehouse, instance and executor variables of this stack."""
        return {**(os.environ if base is None else base),
                "DAGSTER_HOME": str(self.dagster_home),
                "GOBLIN_WAREHOUSE": "ducklake",
                "GOBLIN_DUCKLAKE_CATALOG": self.dsn(CATALOG_DB),
                "GOBLIN_DUCKLAKE_DATA": str(self.root / "lake"),
                "GOBLIN_EXECUTOR": "celery",
                "GOBLIN_CELERY_BROKER": self.broker,
                "GOBLIN_CELERY_BACKEND": f"redis://127.0.0.1:{self.redis_port}/1",
                "GOBLIN_PG_HOST": "127.0.0.1", "GOBLIN_PG_PORT": str(self.pg_port),
                "GOBLIN_PG_USER": PG_USER, "GOBLIN_PG_DB": DAGSTER_DB}

    # -- servers -----------------------------------------------------------------------------
    def start_postgres(self) -> None:
        self.pg_port = _free_port()
        if os.geteuid() == 0:
            # the postgres user cannot reach into root's private temporary folders (pytest's are 0700):
            # the cluster gets its own folder, owned by postgres, removed by stop()
            self.pg_dir = Path(tempfile.mkdtemp(prefix="goblin-pg-"))
            shutil.chown(self.pg_dir, "postgres", "postgres")
        else:
            self.pg_dir = self.root / "pg"
        log = self.pg_dir / "postgres.log"
        self.pg_dir = self.pg_dir / "data"
        if os.geteuid() == 0:
            subprocess.run(_as_postgres(["mkdir", "-m", "700", str(self.pg_dir)]), check=True)
        else:
            self.pg_dir.mkdir(mode=0o700, parents=True)
        run = dict(check=True, capture_output=True, text=True)
        try:
            subprocess.run(_as_postgres([pg_bin("initdb"), "-D", str(self.pg_dir), "-U", PG_USER, "--auth=trust",
                                         "--encoding=UTF8", "--no-sync"]), **run)
            opts = f"-c listen_addresses=127.0.0.1 -p {self.pg_port} -c unix_socket_directories={self.pg_dir} " \
                   f"-c max_connections=200 -c fsync=off"
            subprocess.run(_as_postgres([pg_bin("pg_ctl"), "-D", str(self.pg_dir), "-l", str(log), "-o", opts,
                                         "-w", "-t", "60", "start"]), **run)
        except subprocess.CalledProcessError as exc:
            raise StackError(f"postgres did not start: {exc.stderr}\n{_tail(log)}") from None
        self.pg_started = True
        import psycopg2

        con = psycopg2.connect(self.dsn("postgres"))
        con.autocommit = True
        with con.cursor() as cur:
            for db in (DAGSTER_DB, CATALOG_DB):
                cur.execute(f"CREATE DATABASE {db}")
        con.close()

    def start_redis(self) -> None:
        self.redis_port = _free_port()
        d = self.root / "redis"
        d.mkdir()
        log = open(self.logs / "redis.log", "w")
        p = subprocess.Popen(["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(d),
                              "--save", "", "--appendonly", "no"], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.redis_port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.1)
            if p.poll() is not None:
                break
        raise StackError(f"redis did not start:\n{_tail(self.logs / 'redis.log')}")

    def write_config(self) -> None:
        """The instance's dagster.yaml (PostgreSQL storage) and the workers' celery.yaml, from deploy/'s templates."""
        self.dagster_home.mkdir()
        shutil.copyfile(DEPLOY / "dagster.yaml", self.dagster_home / "dagster.yaml")
        shutil.copyfile(DEPLOY / "celery.yaml", self.root / "celery.yaml")
        (self.root / "lake").mkdir()

    def init_instance(self, timeout: float = 120.0) -> None:
        """Create the instance's tables in PostgreSQL once (``dagster instance migrate``), before any worker.

        Every worker otherwise creates them at its start, and two workers doing so at once race on the
        same ``CREATE TABLE`` (a unique violation on PostgreSQL's catalog that kills one of them).
        Raises StackError with the command's output.
        """
        proc = subprocess.run(dagster_cli(self.env(), "instance", "migrate"), env=self.env(), capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode != 0:
            raise StackError(f"dagster instance migrate failed:\n{(proc.stdout + proc.stderr)[-3000:]}")

    def start_workers(self, n: int, concurrency: int = 1) -> None:
        """``n`` worker processes (``dagster-celery worker start``), each running ``concurrency`` steps at a time.

        Worker ``i`` stands for one GPU host: it listens on the default queue ``dagster`` and on its own
        queue :func:`host_queue` ``(i)``; a run whose executor config names that queue runs on it only."""
        bindir = str(Path(sys.executable).parent)
        exe = str(Path(bindir) / "dagster-celery")
        env = self.env()
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")   # it starts `celery` from the PATH
        for i in range(n):
            log = open(self.logs / f"worker{i}.log", "w")
            p = subprocess.Popen([exe, "worker", "start", "-y", str(self.root / "celery.yaml"), "--name", f"goblin{i}",
                                  "-q", f"dagster,{host_queue(i)}", "-A", "dagster_celery.app", "--",
                                  "--concurrency", str(concurrency), "--pool", "prefork",
                                  "--without-gossip", "--without-mingle", "--without-heartbeat"],
                                 env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.workers.append(p)
        self.wait_workers(n)

    def wait_workers(self, n: int, timeout: float = 120.0) -> None:
        """Wait until ``n`` workers answer a ping over the broker."""
        from celery import Celery

        app = Celery(broker=self.broker)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                dead = [w for w in self.workers if w.poll() is not None]
                if dead:
                    raise StackError("a worker exited:\n" + "\n".join(_tail(self.logs / f"worker{i}.log")
                                                                      for i in range(len(self.workers))))
                replies = app.control.ping(timeout=1.0) or []
                if len(replies) >= n:
                    return
                time.sleep(0.5)
        finally:
            app.close()
        raise StackError(f"{n} workers did not answer within {timeout:.0f} s:\n{_tail(self.logs / 'worker0.log')}")

    def stop_workers(self) -> None:
        _stop(self.workers)
        self.workers.clear()

    def stop(self) -> None:
        """Stop every process this stack started (workers, Redis, PostgreSQL); safe to call twice."""
        self.stop_workers()
        _stop(self.procs)
        self.procs.clear()
        if self.pg_started:
            subprocess.run(_as_postgres([pg_bin("pg_ctl"), "-D", str(self.pg_dir), "-m", "immediate", "-w", "stop"]),
                           capture_output=True)
            self.pg_started = False
        if self.pg_dir is not None and not self.pg_dir.is_relative_to(self.root):
            shutil.rmtree(self.pg_dir.parent, ignore_errors=True)   # root's run: the cluster's own folder


def _stop(procs: list[subprocess.Popen], grace: float = 15.0) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)   # its own session: the worker's pool children too
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def start(workers: int = 2, root: Path | None = None, concurrency: int = 1) -> Stack:
    """Start PostgreSQL, Redis and ``workers`` Celery workers under ``root`` (a new temporary directory by default).

    Raises StackError (and leaves nothing running) when a piece does not start.
    """
    root = Path(root) if root else Path(tempfile.mkdtemp(prefix="goblin-stack-"))
    s = Stack(root=root)
    s.logs.mkdir(parents=True, exist_ok=True)
    try:
        s.start_postgres()
        s.start_redis()
        s.write_config()
        s.init_instance()
        if workers:
            s.start_workers(workers, concurrency)
    except BaseException:
        s.stop()
        raise
    return s


def host_queue(i: int) -> str:
    """The Celery queue of worker ``i`` of the local stack (one per simulated GPU host)."""
    return f"host{i}"


#: Where the configuration files live (the instance's dagster.yaml, the workers' celery.yaml).
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


#: The audit of one partition: every partitioned audit asset (kb_rules and kb_index, unpartitioned, once before).
AUDIT_SELECTION = ("workload_source,training_config,profile_run,waste_budget,tensor_sketches,mined_patterns,"
                   "kb_matches,patch,benchmark_baseline,benchmark_patched,audit_report")
KB_SELECTION = "kb_rules,kb_index"


def dagster_cli(env: dict[str, str], *args: str) -> list[str]:
    """``python -m dagster <args>`` on the project's definitions."""
    return [sys.executable, "-m", "dagster", *args]


def add_partitions(env: dict[str, str], names: list[str]) -> None:
    """Add the workload partitions ``names`` to the instance of ``env`` (its DAGSTER_HOME)."""
    code = ("import sys, dagster as dg\n"
            "with dg.DagsterInstance.get() as i:\n"
            "    i.add_dynamic_partitions('workloads', sys.argv[1:])\n")
    subprocess.run([sys.executable, "-c", code, *names], env=env, check=True, capture_output=True, text=True)


def materialize(env: dict[str, str], select: str, partition: str | None = None, queue: str | None = None
                ) -> subprocess.Popen:
    """Start ``dagster asset materialize`` of ``select`` (one run; its steps go to the executor of ``env``,
    with ``queue`` every step to that Celery queue)."""
    args = ["asset", "materialize", "-m", "goblin_assets.definitions", "--select", select]
    if partition:
        args += ["--partition", partition]
    if queue:
        args += ["--config-json", json.dumps({"execution": {"config": {"queue": queue}}})]
    return subprocess.Popen(dagster_cli(env, *args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def audit_partitions(env: dict[str, str], partitions: list[str], timeout: float = 1200.0,
                     queues: dict[str, str] | None = None) -> tuple[float, dict[str, tuple[int, str]]]:
    """Materialize the audit of every partition at once (one run each, started together); wall seconds and
    ``partition -> (exit code, output)``.  ``queues``: partition -> the Celery queue its run's steps go to
    (the host that audits it).  The knowledge-base index must exist (:data:`KB_SELECTION`)."""
    t0 = time.perf_counter()
    procs = {p: materialize(env, AUDIT_SELECTION, p, (queues or {}).get(p)) for p in partitions}
    out: dict[str, tuple[int, str]] = {}
    try:
        for p, proc in procs.items():
            text = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))[0]
            out[p] = (proc.returncode, text)
    finally:
        _stop([q for q in procs.values() if q.poll() is None], grace=5.0)
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    """``python -m goblin_assets.stack [--workers N] [--root DIR]``: start the stack, print its variables, wait for Ctrl-C."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m goblin_assets.stack", description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--root", type=Path, default=None)
    a = ap.parse_args(argv)
    missing = missing_servers()
    if missing:
        print(f"cannot start the stack: missing {', '.join(missing)} (make system-deps)", file=sys.stderr)
        return 2
    s = start(a.workers, a.root)
    try:
        keys = ("DAGSTER_HOME", "GOBLIN_WAREHOUSE", "GOBLIN_DUCKLAKE_CATALOG", "GOBLIN_DUCKLAKE_DATA", "GOBLIN_EXECUTOR",
                "GOBLIN_CELERY_BROKER", "GOBLIN_CELERY_BACKEND", "GOBLIN_PG_HOST", "GOBLIN_PG_PORT", "GOBLIN_PG_USER",
                "GOBLIN_PG_DB")
        env = s.env({})
        print(f"stack up under {s.root} ({a.workers} workers); in another shell:")
        for k in keys:
            print(f"export {k}='{env[k]}'")
        print("then: .venv/bin/dagster dev -m goblin_assets.definitions  (Ctrl-C here stops everything)", flush=True)
        sigs = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        signal.sigwait(sigs)
    finally:
        s.stop()
        print("stack stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
