#!/usr/bin/env python3
"""The independent reader of the lake tests: reads what a parquet sink wrote with pyarrow
(PyPI; scripts/test.sh installs it) and prints it as one JSON object.

    read_parquet.py dir <directory>
    read_parquet.py s3 <endpoint> <bucket> <prefix>     (moto: static test keys, path-style)
    read_parquet.py mkbucket <endpoint> <bucket>
    read_parquet.py current <docs/sinks.md> dir <directory> | s3 <endpoint> <bucket> <prefix>

`current` runs the current-state query docs/sinks.md §7.10 gives, with DuckDB (PyPI), on the
location's files and prints {pk: document}.

Prints {"files": {name: rows}, "manifests": {run: manifest}, "commits": [names],
"schema": {column: type}, "codecs": {name: its first column's compression}, "rows": [...]}: every row of every *.parquet file under the
location (with "_file": its name), binary values as base64, timestamps as unix ms.
"""
import base64
import datetime
import json
import os
import sys
import tempfile

import pyarrow.parquet as pq


def s3_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(s3={"addressing_style": "path"}),
    )


def download(endpoint, bucket, prefix, into):
    s3 = s3_client(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            name = obj["Key"][len(prefix):].lstrip("/")
            path = os.path.join(into, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            s3.download_file(bucket, obj["Key"], path)


def plain(value):
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return value


def read(root):
    out = {"files": {}, "manifests": {}, "commits": [], "schema": {}, "codecs": {}, "rows": []}
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if name == "_manifest.json":
                with open(path) as f:
                    out["manifests"][os.path.dirname(rel)] = json.load(f)
            elif rel.startswith("_ddbpipe/commits/"):
                out["commits"].append(rel)
            elif name.endswith(".parquet"):
                table = pq.read_table(path, partitioning=None)
                out["files"][rel] = table.num_rows
                meta = pq.ParquetFile(path).metadata
                if meta.num_row_groups > 0:
                    out["codecs"][rel] = meta.row_group(0).column(0).compression
                for field in table.schema:
                    out["schema"][field.name] = str(field.type)
                for row in table.to_pylist():
                    row = {k: plain(v) for k, v in row.items()}
                    row["_file"] = rel
                    out["rows"].append(row)
    out["commits"].sort()
    return out


def documented_query(docs, first_line="-- The changelog's current state"):
    """A current-state query of docs/sinks.md, as written there: from its first line to the
    end of its block."""
    text = open(docs).read()
    start = text.index(first_line)
    end = text.index("```", start)
    return text[start:end]


def current(docs, root):
    import duckdb

    sql = documented_query(docs).replace("s3://bucket/dynamodb/orders/", root.rstrip("/") + "/")
    return documents_by_key(duckdb.sql(sql))


def documents_by_key(result):
    """A current-state query's result as {pk: document}."""
    names = result.columns
    out = {}
    for row in result.fetchall():
        row = dict(zip(names, row))
        out[row["pk"]] = json.loads(row["document"])
    return out


def main():
    kind = sys.argv[1]
    if kind == "current":
        docs, where = sys.argv[2], sys.argv[3]
        if where == "dir":
            print(json.dumps(current(docs, sys.argv[4])))
        else:
            with tempfile.TemporaryDirectory() as into:
                download(sys.argv[4], sys.argv[5], sys.argv[6], into)
                print(json.dumps(current(docs, into)))
    elif kind == "dir":
        print(json.dumps(read(sys.argv[2])))
    elif kind == "s3":
        with tempfile.TemporaryDirectory() as into:
            download(sys.argv[2], sys.argv[3], sys.argv[4], into)
            print(json.dumps(read(into)))
    elif kind == "mkbucket":
        s3_client(sys.argv[2]).create_bucket(Bucket=sys.argv[3])
    else:
        sys.exit(f"unknown command {kind}")


if __name__ == "__main__":
    main()
