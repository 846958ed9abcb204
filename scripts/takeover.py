#!/usr/bin/env python3
"""Measures a shared scan's take-over after a SIGKILL, and the lease table's request rate per
worker, on moto (docs/coordination.md §11.10; the closing figures of the README's "Running
several workers").

Usage: scripts/takeover.py [path/to/ddbpipe] [lease_duration_secs]

Two workers share a slow scan (16 segments, two read units a second each); once both write,
worker `a` is SIGKILLed. The take-over time is from the kill to worker `b` taking the last of
`a`'s segments, read from `b`'s JSON log. Each worker's lease requests come from its metrics
file (`ddbpipe_lease_requests_total`), divided by its run time.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import boto3

BINARY = sys.argv[1] if len(sys.argv) > 1 else "target/debug/ddbpipe"
DURATION = int(sys.argv[2]) if len(sys.argv) > 2 else 10
ITEMS = 2400


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    port = free_port()
    moto = subprocess.Popen(
        ["moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run(port)
    finally:
        moto.kill()


def run(port):
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.1)
    ddb = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    ddb.create_table(
        TableName="items",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for start in range(0, ITEMS, 25):
        ddb.batch_write_item(
            RequestItems={
                "items": [
                    {"PutRequest": {"Item": {"pk": {"S": f"k{i:05}"}}}}
                    for i in range(start, start + 25)
                ]
            }
        )
    tmp = tempfile.mkdtemp()
    procs = {}
    for worker in ("a", "b"):
        config = os.path.join(tmp, f"{worker}.yaml")
        with open(config, "w") as f:
            f.write(
                f"""name: takeover
source:
  region: us-east-1
  endpoint_url: {endpoint}
  credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}
  table_name: items
  segments: 16
  max_concurrency: 2
  page_limit: 10
  batch_size: 10
  max_read_units_per_second: 2
sink: {{type: jsonl, path: '{tmp}/out-{{worker}}.jsonl'}}
coordination: {{lease_table: leases, worker_id: {worker}, lease_duration_secs: {DURATION}}}
"""
            )
        log = open(os.path.join(tmp, f"{worker}.log"), "w")
        procs[worker] = subprocess.Popen(
            [BINARY, "run", "--progress", "never", "--log-format", "json",
             "--metrics-file", os.path.join(tmp, f"{worker}.prom"), config],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    started = time.time()
    while not all(
        os.path.exists(os.path.join(tmp, f"out-{w}.jsonl"))
        and os.path.getsize(os.path.join(tmp, f"out-{w}.jsonl")) > 0
        for w in ("a", "b")
    ):
        time.sleep(0.05)
    time.sleep(DURATION)  # both settled into their shares
    leases = ddb.query(
        TableName="leases",
        KeyConditionExpression="#p = :p",
        ExpressionAttributeNames={"#p": "pipeline"},
        ExpressionAttributeValues={":p": {"S": "takeover"}},
        ConsistentRead=True,
    )["Items"]
    held_by_a = {
        item["unit"]["S"]
        for item in leases
        if item.get("owner", {}).get("S") == "a" and item["unit"]["S"] != "leader"
    }
    procs["a"].send_signal(signal.SIGKILL)
    killed = time.time()
    procs["a"].wait()
    code = procs["b"].wait()
    ended = time.time()
    takes = []
    with open(os.path.join(tmp, "b.log")) as f:
        for line in f:
            event = json.loads(line)
            if event.get("message") == "Lease taken." and event.get("lease") in held_by_a:
                takes.append(event["timestamp"])
    # Only takes after the kill: a unit may have changed hands earlier (a steal, a hand-back).
    times = sorted(t for t in (parse(t) for t in takes) if t > killed)
    rates = {}
    for worker, until in (("a", killed), ("b", ended)):
        path = os.path.join(tmp, f"{worker}.prom")
        total = 0
        if os.path.exists(path):
            for line in open(path):
                m = re.match(r"ddbpipe_lease_requests_total\{.*\} (\d+)", line)
                if m:
                    total += int(m.group(1))
        rates[worker] = (total, until - started)
    union = set()
    for worker in ("a", "b"):
        with open(os.path.join(tmp, f"out-{worker}.jsonl")) as f:
            union.update(json.loads(line)["pk"] for line in f)
    print(f"lease_duration_secs {DURATION}; worker b exit {code}; items in the union {len(union)} of {ITEMS}")
    print(f"a held {len(held_by_a)} segment(s) when killed; b took {len(times)} of them after the kill")
    if times:
        print(f"take-over: first {times[0] - killed:.2f} s, last {times[-1] - killed:.2f} s after the SIGKILL")
    total, took = rates["b"]
    print(f"worker b: {total} lease requests in {took:.1f} s = {total / took:.2f}/s (a's metrics file is not written: SIGKILL)")


def parse(stamp):
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    main()
