"""The Python eventsourcing library's DCB application on its UmaDB persistence module, as its
users write one: a small dog school where each operation registers a dog (one decision
appended under a condition) or teaches a registered dog a trick (the dog's decisions read,
then one appended under a condition on them). N threads, each with its own application
object, against Annals, UmaDB's own server and (with --postgres) Annals on PostgreSQL, each on
a fresh store, in alternated runs. Prints one JSON line: each server's median operations per
second, latency percentiles (microseconds) and failed operations (`failed_calls`). D3 on every
server.

Usage: target/python/bin/python bench/eventsourcing_app.py --annals-bin target/release/annals \\
           --umadb-bin "$ANNALS_UMADB_BIN" [--postgres] [--threads N] [--seconds S] \\
           [--runs R] [--dir DIR]
"""

import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dog_school import School  # noqa: E402
from python_client import command_line, measure  # noqa: E402


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


def main():
    args = command_line("/tmp/annals-bench-eventsourcing", 5.0)
    out = {"workload": "eventsourcing_dcb_application",
           "client": "eventsourcing 10.0.0a7 with eventsourcing-umadb 0.4.4 (Python)",
           "operations": "a quarter registrations (one conditional append), the rest a read of "
                         "one dog then a conditional append",
           "threads": args.threads, "durability": "d3", "runs": args.runs, "seconds": args.seconds}
    print(json.dumps(measure(args, worker, "operations", out)))


if __name__ == "__main__":
    main()
