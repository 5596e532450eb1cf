"""The Python eventsourcing library's DCB application on its UmaDB persistence module, as its
users write one: a small dog school where each operation registers a dog (one decision
appended under a condition) or teaches a registered dog a trick (the dog's decisions read,
then one appended under a condition on them). N threads, each with its own application
object, against Annals, UmaDB's own server and (with --postgres) Annals on PostgreSQL, each on
a fresh store, in alternated runs. Prints one JSON line: each server's median operations per
second, latency percentiles (microseconds) and failed operations (`failed_calls`). D3 on every
server.

Usage: target/python/bin/python bench/eventsourcing_app.py --annals-bin target/release/annals \\
           --umadb-bin target/umadb/bin/umadb [--postgres] [--threads N] [--seconds S] \\
           [--runs R] [--dir DIR]
"""

import json
import os
import random
import sys
import time
from uuid import uuid4

from eventsourcing.domain import event
from eventsourcing.pydantic.application import DcbApplication
from eventsourcing.pydantic.immutable import Decision
from eventsourcing.pydantic.mutable import EnduringObject

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client import command_line, measure  # noqa: E402


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
