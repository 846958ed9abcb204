#!/usr/bin/env python3
"""Measures a shared scan's take-over after a SIGKILL, and the lease table's request rate per
worker, on moto (docs/coordination.md §11.10; the closing figures of the README's "Running
several workers").

Usage: scripts/takeover.py [path/to/ddbpipe] [lease_duration_secs] [streams]

Two workers share a slow scan (16 segments, two read units a second each); once both write,
worker `a` is SIGKILLed. The take-over time is from the kill to worker `b` taking the last of
`a`'s segments, read from `b`'s JSON log. Each worker's lease requests come from its metrics
file (`ddbpipe_lease_requests_total`), divided by its run time.

With `streams` (docs/coordination.md §11.11): two workers follow the stream of a table written
ten times a second; the worker holding its shard is SIGKILLed. The take-over is from the kill to
the other worker taking the shard, and to the first change written after the kill reaching the
other worker's file; the survivor is then stopped with SIGTERM.
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
STREAMS = len(sys.argv) > 3 and sys.argv[3] == "streams"
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
        if STREAMS:
            run_streams(port)
        else:
            run(port)
    finally:
        moto.kill()


def run(port):
    endpoint, ddb = client(port)
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
    rates = {
        "a": (lease_requests(os.path.join(tmp, "a.prom")), killed - started),
        "b": (lease_requests(os.path.join(tmp, "b.prom")), ended - started),
    }
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


def lease_requests(path):
    total = 0
    if os.path.exists(path):
        for line in open(path):
            m = re.match(r"ddbpipe_lease_requests_total\{.*\} (\d+)", line)
            if m:
                total += int(m.group(1))
    return total


def run_streams(port):
    import threading

    endpoint, ddb = client(port)
    ddb.create_table(
        TableName="items",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    tmp = tempfile.mkdtemp()
    written = []  # (time, pk) of every put
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            pk = f"w{i:06}"
            ddb.put_item(TableName="items", Item={"pk": {"S": pk}})
            written.append((time.time(), pk))
            i += 1
            time.sleep(0.1)

    thread = threading.Thread(target=writer)
    thread.start()
    procs = {}
    for worker in ("a", "b"):
        config = os.path.join(tmp, f"{worker}.yaml")
        with open(config, "w") as f:
            f.write(
                f"""name: takeover-stream
source:
  region: us-east-1
  endpoint_url: {endpoint}
  credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}
  table_name: items
  mode: streams
  follow: true
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

    def owner():
        items = ddb.query(
            TableName="leases",
            KeyConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": "pipeline"},
            ExpressionAttributeValues={":p": {"S": "takeover-stream"}},
            ConsistentRead=True,
        )["Items"]
        for item in items:
            if item["unit"]["S"].startswith("shard:"):
                return item.get("owner", {}).get("S")
        return None

    holder = None
    while holder is None:
        time.sleep(0.2)
        try:
            holder = owner()
        except Exception:
            holder = None
    time.sleep(2 * DURATION)  # both settled: one reads, one stands by
    holder = owner()
    survivor = "b" if holder == "a" else "a"
    procs[holder].send_signal(signal.SIGKILL)
    killed = time.time()
    procs[holder].wait()
    after = [pk for (t, pk) in written if t > killed]
    first_after = None
    out = os.path.join(tmp, f"out-{survivor}.jsonl")
    while first_after is None and time.time() - killed < 10 * DURATION:
        time.sleep(0.05)
        seen = set()
        if os.path.exists(out):
            with open(out) as f:
                for line in f:
                    try:
                        seen.add(json.loads(line)["key"]["pk"])
                    except (ValueError, KeyError):
                        pass
        after = [pk for (t, pk) in written if t > killed]
        if after and after[0] in seen:
            first_after = time.time()
    stop.set()
    thread.join()
    time.sleep(3)
    procs[survivor].send_signal(signal.SIGTERM)
    code = procs[survivor].wait()
    ended = time.time()
    taken = None
    with open(os.path.join(tmp, f"{survivor}.log")) as f:
        for line in f:
            event = json.loads(line)
            if event.get("message") == "Lease taken." and str(event.get("lease", "")).startswith("shard:"):
                stamp = parse(event["timestamp"])
                if stamp > killed and taken is None:
                    taken = stamp
    union = set()
    for worker in ("a", "b"):
        path = os.path.join(tmp, f"out-{worker}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                union.update(json.loads(line)["key"]["pk"] for line in f)
    missing = [pk for (_, pk) in written if pk not in union]
    print(f"lease_duration_secs {DURATION}; {holder} held the shard and was killed; {survivor} exit {code}")
    print(f"changes written {len(written)}, missing from both files {len(missing)}")
    if taken:
        print(f"take-over: shard taken {taken - killed:.2f} s after the SIGKILL")
    if first_after:
        print(f"first change written after the kill in {survivor}'s file {first_after - killed:.2f} s after it")
    total = lease_requests(os.path.join(tmp, f"{survivor}.prom"))
    took = ended - started
    print(f"worker {survivor}: {total} lease requests in {took:.1f} s = {total / took:.2f}/s")


def parse(stamp):
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    main()
