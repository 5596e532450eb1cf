#!/usr/bin/env python3
"""Builds every test binary of the workspace once, then runs them in lanes: most one after
another, as `cargo test` would; those that mostly wait (on PostgreSQL clusters, on a client's
timeouts) in a second lane beside them; the HTTP/2 conformance run alone at the end, since
h2spec times each case. Each binary's output is printed whole when it ends, with its time;
the exit status is 1 if any binary failed, and each failed binary's failures are printed again
at the very end, where a log's tail shows them. Usage: scripts/lanes.py [cargo test options...]
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

# Binaries (package, target) that spend their time waiting on another process (PostgreSQL's
# clusters, UmaDB's server, the container engine), not on the CPU.
WAITING = {
    ("annals", "backends"),
    ("annals", "postgres"),
    ("annals", "postgres_subjects"),
    ("annals-cli", "server_postgres"),
    ("annals-cli", "differential"),
    ("annals-cli", "container"),
    ("annals-cli", "server_traces"),
    ("annals-cli", "server_otlp_metrics"),
    ("annals-cli", "clients"),
}
# Binaries that must have the machine to themselves.
ALONE = {("annals-cli", "h2spec")}

print_lock = threading.Lock()
results = []


def build(extra):
    """Builds the test binaries; answers (package, target, kind, executable, directory)."""
    command = ["cargo", "test", "--workspace", "--all-targets", "--no-run",
               "--message-format=json-render-diagnostics", *extra]
    out = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(out.returncode)
    binaries = []
    for line in out.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"]:
            continue
        directory = os.path.dirname(message["manifest_path"])
        package = os.path.basename(directory)
        target = message["target"]
        binaries.append((package, target["name"], target["kind"][0], message["executable"],
                         directory))
    return binaries


def run(binary):
    package, name, kind, executable, directory = binary
    started = time.monotonic()
    out = subprocess.run([executable], cwd=directory, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace")
    took = time.monotonic() - started
    with print_lock:
        print(f"== {package} {kind} {name} ({took:.1f} s)", flush=True)
        print(out.stdout, end="", flush=True)
        results.append((out.returncode, package, name, took, out.stdout))


# Where another test runner's output says what failed, inside a failed test's output: node's
# TAP (`not ok`), Go's `--- FAIL`, Maven's `[ERROR]`, pytest's `FAILED` and `E   `.
FOREIGN_FAILURE = re.compile(r"^\s*(not ok \d|--- FAIL|\[ERROR\]|FAILED |E   )")


def shortened(block, keep, around=25, most=10):
    """A failed test's output: its first line, the `around` lines from each of the first `most`
    lines where another runner says what failed, and its last `keep` lines, each line once and
    in order."""
    chosen = {0} | set(range(max(1, len(block) - keep), len(block)))
    found = [i for i, line in enumerate(block) if FOREIGN_FAILURE.match(line)]
    for i in found[:most]:
        chosen |= set(range(i, min(i + around, len(block))))
    out, last = [], -1
    for i in sorted(chosen):
        if i > last + 1:
            out.append(f"[... {i - last - 1} lines]")
        out.append(block[i])
        last = i
    return out


def failures(text, keep=60):
    """What a failed binary's output says of its failures: the test harness's `failures:`
    section, with each failed test's output shortened (`shortened`: where its panic is, and
    where the runner it drove said what failed) and the list of their names; or the output's
    last lines when it ended without one (a crash, a signal)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "failures:"]
    if not starts:
        return "\n".join(lines[-keep:])
    kept, block = [], []
    for line in lines[starts[0]:]:
        if line.startswith("---- ") or line == "failures:":
            kept += shortened(block, keep) if block else []
            block = []
        block.append(line)
    kept += block
    return "\n".join(kept)


def lane(binaries):
    for binary in binaries:
        run(binary)


def main():
    binaries = build(sys.argv[1:])
    key = lambda b: (b[0], b[1])
    found = {key(b) for b in binaries}
    for listed in sorted((WAITING | ALONE) - found):
        print(f"lanes.py names {listed}, which is not a test binary of the workspace",
              file=sys.stderr)
        sys.exit(2)
    alone = [b for b in binaries if key(b) in ALONE]
    waiting = [b for b in binaries if key(b) in WAITING]
    rest = [b for b in binaries if key(b) not in ALONE and key(b) not in WAITING]
    started = time.monotonic()
    second = threading.Thread(target=lane, args=(waiting,))
    second.start()
    lane(rest)
    second.join()
    lane(alone)
    failed = [(p, n, text) for code, p, n, _, text in results if code != 0]
    for package, name, text in failed:
        print(f"== failures of {package} {name}", flush=True)
        print(failures(text), flush=True)
    print(f"== {len(results)} test binaries in {time.monotonic() - started:.0f} s; "
          f"{len(failed)} failed", flush=True)
    for package, name, _ in failed:
        print(f"   failed: {package} {name}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
