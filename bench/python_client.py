"""UmaDB's Python client (the `umadb` package) appending as its users write it: conditional
appends of one 256-byte event with 2 tags from N threads, each with its own client, against
Annals and against UmaDB's own server, each started on a fresh store in DIR, in alternated
runs. Prints one JSON line: each server's median appends per second, latency percentiles
(microseconds) and failed calls. D3 on both servers. With --postgres, Annals is also measured
on PostgreSQL: a throwaway cluster with PostgreSQL's defaults made with the programs of the
newest /usr/lib/postgresql/*/bin (or --pg-bin), a fresh database per run.

Usage: target/python/bin/python bench/python_client.py --annals-bin target/release/annals \
           --umadb-bin "$ANNALS_UMADB_BIN" [--postgres] [--threads N] [--seconds S] \
           [--runs R] [--dir DIR]
"""

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid

from umadb import AppendCondition, Client, Event, Query, QueryItem


def writer(url, stop_at, latencies, errors):
    client = Client(url)
    stream = f"stream:{uuid.uuid4().hex}"
    data = b"x" * 256
    last = None
    while time.monotonic() < stop_at:
        condition = AppendCondition(
            fail_if_events_match=Query(items=[QueryItem(tags=[stream])]), after=last
        )
        started = time.perf_counter_ns()
        try:
            last = client.append(
                [Event(event_type="Appended", tags=[stream, "kind:1"], data=data)],
                condition=condition,
            )
            latencies.append((time.perf_counter_ns() - started) // 1000)
        except Exception as e:  # counted, not hidden
            errors.append(str(e))
    client.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A throwaway PostgreSQL cluster with its defaults, run as the `postgres` user when this
    runs as root (PostgreSQL refuses root)."""

    def __init__(self, bin_dir):
        self.bin = bin_dir or sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.dir = tempfile.mkdtemp(prefix="annals-bench-pg")
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            subprocess.run(["chown", "postgres:postgres", self.dir], check=True)
        data = os.path.join(self.dir, "data")
        self.run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-instructions")
        self.run("pg_ctl", "-D", data, "-l", os.path.join(self.dir, "log"), "-w", "-o",
                 f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")

    def run(self, program, *args):
        command = [os.path.join(self.bin, program), *args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    def fresh_database(self, name):
        """Drops and creates database `name`; its postgres:// URL."""
        for sql in (f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}"):
            subprocess.run(
                [os.path.join(self.bin, "psql"), "-X", "-q", "-h", "127.0.0.1", "-p",
                 str(self.port), "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1",
                 "-c", sql],
                check=True, stdout=subprocess.DEVNULL,
                env={**os.environ, "PGOPTIONS": "-c client_min_messages=warning"})
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self):
        self.run("pg_ctl", "-D", os.path.join(self.dir, "data"), "-m", "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def start(kind, binary, directory, cluster=None):
    """A server on a fresh store in `directory` (or a fresh database of `cluster`): (process,
    gRPC URL)."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    if kind in ("annals", "annals_postgres"):
        if kind == "annals":
            store = ["--data-dir", directory]
        else:
            store = ["--store", cluster.fresh_database("annals_python")]
        process = subprocess.Popen(
            [binary, "serve", *store, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
            stdout=subprocess.PIPE, text=True)
        for line in process.stdout:
            if line.startswith("annals: listening "):
                grpc = [p for p in line.split() if p.startswith("grpc=")][0][len("grpc="):]
                threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
                return process, f"http://{grpc}"
        raise RuntimeError("annals did not start")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{port}", "--db-path", os.path.join(directory, "uma.db")],
        stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def one_run(worker, url, threads, seconds, unit):
    """`threads` threads, each running worker(url, stop_at, latencies, errors) until `seconds`
    have passed: `unit`s per second, failed ones, the first error and latency percentiles
    (microseconds)."""
    latencies, errors = [], []
    stop_at = time.monotonic() + seconds
    workers = [threading.Thread(target=worker, args=(url, stop_at, latencies, errors))
               for _ in range(threads)]
    started = time.monotonic()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    elapsed = time.monotonic() - started
    latencies.sort()

    def pct(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None

    return {
        f"{unit}_per_sec": round(len(latencies) / elapsed),
        "failed_calls": len(errors),
        "first_error": errors[0] if errors else None,
        "latency_us": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                       "max": latencies[-1] if latencies else None},
    }


def command_line(default_dir, default_seconds):
    """The flags every Python benchmark takes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--annals-bin", required=True)
    parser.add_argument("--umadb-bin")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=default_seconds)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=default_dir)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--pg-bin")
    return parser.parse_args()


def measure(args, worker, unit, out):
    """Runs `worker` against Annals, UmaDB (--umadb-bin) and Annals on PostgreSQL (--postgres),
    each on a fresh store, in alternated runs; adds each server's median run to `out`, with
    every run's rate and the failures of all runs, and each Annals figure against UmaDB's.
    Returns `out`."""
    servers = [("annals", args.annals_bin)] + ([("umadb", args.umadb_bin)] if args.umadb_bin else [])
    cluster = None
    if args.postgres:
        cluster = Cluster(args.pg_bin)
        servers.append(("annals_postgres", args.annals_bin))
    results = {kind: [] for kind, _ in servers}
    try:
        for run in range(args.runs):
            order = servers if run % 2 == 0 else list(reversed(servers))
            for kind, binary in order:
                process, url = start(kind, binary, os.path.join(args.dir, kind), cluster)
                try:
                    results[kind].append(one_run(worker, url, args.threads, args.seconds, unit))
                finally:
                    process.terminate()
                    process.wait()
    finally:
        if cluster:
            cluster.stop()
    rate = f"{unit}_per_sec"
    for kind, runs in results.items():
        runs.sort(key=lambda r: r[rate])
        median = dict(runs[len(runs) // 2])
        median[f"runs_{rate}"] = [r[rate] for r in runs]
        median["failed_calls"] = sum(r["failed_calls"] for r in runs)
        median["first_error"] = next((r["first_error"] for r in runs if r["first_error"]), None)
        out[kind] = median
    if "umadb" in out:
        for kind in ("annals", "annals_postgres"):
            if kind in out:
                out[f"{kind}_to_umadb"] = round(out[kind][rate] / max(1, out["umadb"][rate]), 2)
    return out


def main():
    args = command_line("/tmp/annals-bench-python", 10.0)
    out = {"workload": "umadb_python_client_conditional_append", "client": "umadb 0.7.8 (Python)",
           "threads": args.threads, "durability": "d3", "runs": args.runs, "seconds": args.seconds}
    print(json.dumps(measure(args, writer, "appends", out)))


if __name__ == "__main__":
    main()
