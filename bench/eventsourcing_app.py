"""The Python eventsourcing library's DCB application on its UmaDB persistence module, as its
users write one: a small dog school where each operation registers a dog (one decision
appended under a condition) or teaches a registered dog a trick (the dog's decisions read,
then one appended under a condition on them). N threads, each with its own application
object, against Annals, UmaDB's own server and (with --postgres) Annals on PostgreSQL, each on
a fresh store, in alternated runs. Prints one JSON line: each server's median operations per
second, latency percentiles (microseconds) and failed operations. D3 on every server.

Usage: target/python/bin/python bench/eventsourcing_app.py --annals-bin target/release/annals \\
           --umadb-bin target/umadb/bin/umadb [--postgres] [--threads N] [--seconds S] \\
           [--runs R] [--dir DIR]
"""

import argparse
import json
import os
import random
import sys
import threading
import time
from uuid import uuid4

from eventsourcing.domain import event
from eventsourcing.pydantic.application import DcbApplication
from eventsourcing.pydantic.immutable import Decision
from eventsourcing.pydantic.mutable import EnduringObject

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client import Cluster, start  # noqa: E402


class Dog(EnduringObject):
    class Registered(Decision):
        dog_id: str
        name: str

    class TrickAdded(Decision):
        dog_id: str
        trick: str

    @event(Registered)
    def __init__(self, *, dog_id: str, name: str) -> None:
        self.id = dog_id
        self.name = name
        self.tricks: list[str] = []

    @event(TrickAdded)
    def add_trick(self, trick: str) -> None:
        self.tricks.append(trick)


class School(DcbApplication):
    def register(self, name):
        dog = Dog(dog_id=str(uuid4()), name=name)
        self.repository.save(dog)
        return dog.id

    def teach(self, dog_id, trick):
        dog = self.repository.get(dog_id, Dog)
        dog.add_trick(trick)
        self.repository.save(dog)


def worker(url, stop_at, latencies, errors):
    app = School(env={"PERSISTENCE_MODULE": "eventsourcing_umadb", "UMADB_URI": url})
    dogs = []
    rng = random.Random()
    while time.monotonic() < stop_at:
        started = time.perf_counter_ns()
        try:
            # A quarter registrations, the rest tricks taught to one of this thread's dogs.
            if not dogs or rng.random() < 0.25:
                dogs.append(app.register(f"dog-{len(dogs)}"))
            else:
                app.teach(rng.choice(dogs[-16:]), f"trick-{rng.randrange(1000)}")
            latencies.append((time.perf_counter_ns() - started) // 1000)
        except Exception as e:  # counted, not hidden
            errors.append(repr(e))
    app.close()


def one_run(url, threads, seconds):
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
        "operations_per_sec": round(len(latencies) / elapsed),
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
        "latency_us": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                       "max": latencies[-1] if latencies else None},
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--annals-bin", required=True)
    parser.add_argument("--umadb-bin")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/annals-bench-eventsourcing")
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--pg-bin")
    args = parser.parse_args()
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
                    results[kind].append(one_run(url, args.threads, args.seconds))
                finally:
                    process.terminate()
                    process.wait()
    finally:
        if cluster:
            cluster.stop()
    out = {"workload": "eventsourcing_dcb_application", "client": "eventsourcing 10.0.0a7 with eventsourcing-umadb 0.4.4 (Python)",
           "operations": "a quarter registrations (one conditional append), the rest a read of one dog then a conditional append",
           "threads": args.threads, "durability": "d3", "runs": args.runs, "seconds": args.seconds}
    for kind, runs in results.items():
        runs.sort(key=lambda r: r["operations_per_sec"])
        median = dict(runs[len(runs) // 2])
        median["runs_operations_per_sec"] = [r["operations_per_sec"] for r in runs]
        median["failed"] = sum(r["failed"] for r in runs)
        out[kind] = median
    if "umadb" in out:
        for kind in ("annals", "annals_postgres"):
            if kind in out:
                out[f"{kind}_to_umadb"] = round(
                    out[kind]["operations_per_sec"] / max(1, out["umadb"]["operations_per_sec"]), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
