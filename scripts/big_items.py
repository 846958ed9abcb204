#!/usr/bin/env python3
"""Measures the peak RSS of a load of large items into a keyed sink, with batches bounded by
bytes (`batch_max_bytes`, default 32 MiB) against the same load with the bound raised to 1 GiB
(batches of 5000 records whatever their size, as before issue 24 item 9), measured beside it on
the same table (docs/scan.md §2.5).

Usage: scripts/big_items.py [path/to/ddbpipe] [items] [item_kb] [runs]

The embedded emulator of `ddbpipe demo --keep` (dynoxide, fast enough that batches fill by
count or bytes before their 1 s linger; moto is not) serves a table of `items` items of about
`item_kb` KB each (default 600 of 390 KB, the hostile pass's case); each run is `ddbpipe run` of
a scan into a fresh SQLite file, its peak RSS read from the kernel (`ru_maxrss` of the finished
child). Runs alternate; medians are printed.
"""

import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import boto3

BINARY = sys.argv[1] if len(sys.argv) > 1 else "target/debug/ddbpipe"
ITEMS = int(sys.argv[2]) if len(sys.argv) > 2 else 600
ITEM_KB = int(sys.argv[3]) if len(sys.argv) > 3 else 390
RUNS = int(sys.argv[4]) if len(sys.argv) > 4 else 3


def client(port):
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.1)
    return endpoint, boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def seed(ddb):
    ddb.create_table(
        TableName="big",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for i in range(ITEMS):
        # Letters that vary, so nothing along the way can shrink them.
        body = "".join(chr(97 + (i * 7 + j) % 26) for j in range(ITEM_KB * 1000))
        ddb.put_item(TableName="big", Item={"pk": {"S": f"k{i:05}"}, "body": {"S": body}})


def run_once(endpoint, tmp, label, max_bytes):
    db = os.path.join(tmp, f"{label}.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    config = os.path.join(tmp, f"{label}.yaml")
    bound = f"\n  batch_max_bytes: {max_bytes}" if max_bytes else ""
    with open(config, "w") as f:
        f.write(
            f"""name: big-{label}
source:
  region: us-east-1
  endpoint_url: {endpoint}
  credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}
  table_name: big
  segments: 1{bound}
sink: {{type: sqlite, path: '{db}'}}
"""
        )
    started = time.monotonic()
    child = subprocess.Popen(
        [BINARY, "run", "--progress", "never", config],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, stderr = child.communicate()
    took = time.monotonic() - started
    if child.returncode != 0:
        sys.exit(f"{label}: exit {child.returncode}: {stderr.decode()[-2000:]}")
    return took


def measured(endpoint, tmp, label, max_bytes):
    # A forked child runs the load and reports its own child's peak RSS: ru_maxrss of
    # RUSAGE_CHILDREN is the largest of the waited-for children, so one load per fork.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        took = run_once(endpoint, tmp, label, max_bytes)
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        os.write(write, f"{peak_kib} {took}".encode())
        os._exit(0)
    os.close(write)
    data = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    peak_kib, took = data.split()
    return int(peak_kib) / 1024, float(took)


def emulator(tmp):
    """`ddbpipe demo --keep`'s emulator and its port, once it listens."""
    log = os.path.join(tmp, "demo.log")
    demo = subprocess.Popen(
        [BINARY, "demo", "--keep", "--items", "1", "--dir", os.path.join(tmp, "demo")],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )
    for _ in range(600):
        text = open(log).read()
        found = re.search(r"stays up at http://127\.0\.0\.1:(\d+)", text)
        if found:
            return demo, int(found.group(1))
        if demo.poll() is not None:
            sys.exit(f"ddbpipe demo ended: {text}")
        time.sleep(0.1)
    sys.exit("ddbpipe demo did not start its emulator")


def main():
    tmp = tempfile.mkdtemp()
    demo, port = emulator(tmp)
    try:
        endpoint, ddb = client(port)
        seed(ddb)
        results = {"bounded (32 MiB default)": [], "unbounded (1 GiB)": []}
        for _ in range(RUNS):
            results["bounded (32 MiB default)"].append(measured(endpoint, tmp, "bounded", None))
            results["unbounded (1 GiB)"].append(measured(endpoint, tmp, "unbounded", 1 << 30))
        print(f"{ITEMS} items of {ITEM_KB} KB, scan into SQLite, {RUNS} run(s) each, medians:")
        peaks = {}
        for label, runs in results.items():
            peak = statistics.median(r[0] for r in runs)
            took = statistics.median(r[1] for r in runs)
            peaks[label] = peak
            print(f"  {label:26} peak RSS {peak:8.1f} MiB   {took:6.1f} s")
        bounded, unbounded = peaks.values()
        print(f"  bounded / unbounded peak RSS: {bounded / unbounded:.2f}")
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait()


if __name__ == "__main__":
    main()
