#!/usr/bin/env python3
"""The independent reader of the Iceberg tests: reads what an iceberg sink committed with
pyiceberg (PyPI; scripts/test.sh installs it) through the SQL catalog, or through the Glue
Data Catalog (pyiceberg's GlueCatalog: a catalog uri `glue:<endpoint>`, moto's), through a
REST catalog (pyiceberg's RestCatalog: a catalog uri `rest:<its properties as JSON>`), or from an S3
table bucket (a catalog uri `s3tables:<table bucket arn>`: boto3's GetTableMetadataLocation at
the S3 endpoint, then pyiceberg's StaticTable of that metadata), and prints it as JSON.

    read_iceberg.py table <catalog uri> <catalog name> <namespace.table> [<s3 endpoint>]
    read_iceberg.py current <docs/sinks.md> <catalog uri> <catalog name> <namespace.table> [<s3 endpoint>]
    read_iceberg.py bucket <n> <value>...
    read_iceberg.py glue-table <endpoint> <database> <table>
    read_iceberg.py glue-columns <endpoint> <database> <table>
    read_iceberg.py s3tables-bucket <endpoint> <name>
    read_iceberg.py s3tables-tables <endpoint> <table bucket arn>

`glue-table` makes a Glue table that is not an Iceberg table (a Hive table's parameters), in
a database made when missing, and prints its parameters. `glue-columns` prints the columns a
Glue table lists (boto3's GetTable): [[name, type, {parameters}], ...]. `s3tables-bucket`
makes a table bucket and prints its ARN; `s3tables-tables` prints the bucket's tables:
{"namespace.table": {"warehouse": its warehouse location, "metadata": its metadata location}}.

`table` prints {"schema": {column: type}, "partition": [field names], "snapshots": [{"id",
"parent", "operation", "summary"}] (oldest first), "current": id, "refs": [names],
"files": [paths of the current snapshot's data files], "rows": [every row of the current
snapshot], "properties": {table properties}, "manifests": the current snapshot's manifest
count, "spec": [the default spec's partition terms as pyiceberg says them], "spec_id": its id,
"partitions": [{"file", "partition": [its partition values in the manifest], "spec_id": its
spec's, "rows": [its rows' values, each transformed by pyiceberg as its spec says, one of
each]}], "metrics": [{"file", "rows": its record count, "values" and
"nulls": {column: count} from its manifest entry, "bounds": {column: {"lower", "upper": the
manifest's bounds as pyiceberg decodes them, "min", "max": the file's own values as pyarrow
reads them}}}], "pruned": {"column": the first column, "value": its least value, "files": data
files, "planned": files a scan filtered on that value plans, "holding": files holding it}}:
binary values as base64, timestamps as unix ms (bounds and their min and max: µs).

`bucket` prints Iceberg's bucket (pyiceberg's transform) of each string value among n buckets.

`current` runs the current-state query docs/sinks.md §7.11 gives (pyiceberg's scan into DuckDB,
then the SQL written there) and prints {pk: document}.
"""
import datetime
import json
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import EqualTo
from pyiceberg.catalog.glue import GlueCatalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import StaticTable
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import StringType

# The parquet reader's value conversions and query extraction (beside this file).
from read_parquet import documented_query, documents_by_key, plain


def catalog(uri, name, endpoint):
    if uri.startswith("rest:"):
        # pyiceberg's RestCatalog: its client's own routes, OAuth and prefix handling.
        props = json.loads(uri[len("rest:"):])
        if endpoint:
            props.update(s3_properties(endpoint))
        return RestCatalog(name, **props)
    if uri.startswith("glue:"):
        props = {
            "glue.endpoint": uri[len("glue:"):],
            "glue.region": "us-east-1",
            "glue.access-key-id": "testing",
            "glue.secret-access-key": "testing",
        }
    else:
        props = {"uri": uri}
    if endpoint:
        props.update(s3_properties(endpoint))
    if uri.startswith("glue:"):
        return GlueCatalog(name, **props)
    return SqlCatalog(name, **props)


def s3_properties(endpoint):
    return {
        "s3.endpoint": endpoint,
        "s3.access-key-id": "testing",
        "s3.secret-access-key": "testing",
        "s3.region": "us-east-1",
    }


def aws(service, endpoint):
    """boto3's client of `service` at moto's `endpoint`, with the tests' credentials."""
    import boto3
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def load_table(uri, name, ident, endpoint):
    """Table `ident` of the catalog `uri`: an S3 table read from the metadata S3 Tables holds."""
    if uri.startswith("s3tables:"):
        namespace, table = ident.split(".")
        found = aws("s3tables", endpoint).get_table_metadata_location(
            tableBucketARN=uri[len("s3tables:"):], namespace=namespace, name=table)
        return StaticTable.from_metadata(found["metadataLocation"], s3_properties(endpoint))
    return catalog(uri, name, endpoint).load_table(ident)


def s3tables_tables(endpoint, arn):
    client = aws("s3tables", endpoint)
    out = {}
    for table in client.list_tables(tableBucketARN=arn)["tables"]:
        namespace = table["namespace"]
        namespace = namespace[0] if isinstance(namespace, list) else namespace
        found = client.get_table_metadata_location(
            tableBucketARN=arn, namespace=namespace, name=table["name"])
        out[f"{namespace}.{table['name']}"] = {
            "warehouse": found["warehouseLocation"],
            "metadata": found.get("metadataLocation"),
        }
    return out


def glue_table(endpoint, database, table):
    glue = aws("glue", endpoint)
    try:
        glue.create_database(DatabaseInput={"Name": database})
    except glue.exceptions.AlreadyExistsException:
        pass
    glue.create_table(DatabaseName=database, TableInput={
        "Name": table,
        "TableType": "EXTERNAL_TABLE",
        "Parameters": {"classification": "parquet"},
        "StorageDescriptor": {"Location": f"s3://elsewhere/{table}"},
    })
    return glue.get_table(DatabaseName=database, Name=table)["Table"]["Parameters"]


def glue_columns(endpoint, database, table):
    glue = aws("glue", endpoint)
    found = glue.get_table(DatabaseName=database, Name=table)["Table"]
    columns = found.get("StorageDescriptor", {}).get("Columns", [])
    return [[c["Name"], c["Type"], c.get("Parameters", {})] for c in columns]


def read(table):
    out = {"schema": {}, "partition": [], "snapshots": [], "current": None, "refs": [],
           "files": [], "rows": []}
    for field in table.schema().fields:
        out["schema"][field.name] = str(field.field_type)
    out["partition"] = [f.name for f in table.spec().fields]
    out["spec_id"] = table.spec().spec_id
    out["spec"] = [
        f"{f.transform}({table.schema().find_column_name(f.source_id)})"
        for f in table.spec().fields
    ]
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary
        out["snapshots"].append({
            "id": snapshot.snapshot_id,
            "parent": snapshot.parent_snapshot_id,
            "operation": summary.operation.value if summary else None,
            "summary": dict(summary.additional_properties) if summary else {},
        })
    out["refs"] = sorted(table.metadata.refs.keys())
    current = table.current_snapshot()
    if current is None:
        return out
    out["current"] = current.snapshot_id
    out["properties"] = dict(table.properties)
    out["manifests"] = len(current.manifests(table.io))
    scan = table.scan()
    out["files"] = sorted(task.file.file_path for task in scan.plan_files())
    for row in scan.to_arrow().to_pylist():
        out["rows"].append({k: plain(v) for k, v in row.items()})
    out["partitions"] = [partition_of(table, task.file) for task in scan.plan_files()]
    out["metrics"] = [metrics_of(table, task.file) for task in scan.plan_files()]
    out["pruned"] = pruned(table, out["metrics"])
    return out


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def comparable(value):
    """A bound or a value as JSON compares them: µs for a time, base64 for bytes."""
    if isinstance(value, datetime.datetime):
        return (value - EPOCH) // datetime.timedelta(microseconds=1)
    return plain(value)


FILES = {}


def read_file(table, path):
    """A data file's rows as pyarrow reads them, read once."""
    if path not in FILES:
        with table.io.new_input(path).open() as f:
            FILES[path] = pq.read_table(f)
    return FILES[path]


def metrics_of(table, data_file):
    """A data file's counts and bounds in its manifest entry, beside its own least and
    greatest values."""
    schema = table.schema()
    name = lambda field_id: schema.find_field(field_id).name
    rows = read_file(table, data_file.file_path)
    bounds = {}
    for field_id, lower in (data_file.lower_bounds or {}).items():
        field = schema.find_field(field_id)
        least = pc.min_max(rows.column(field.name))
        bounds[field.name] = {
            "lower": comparable(from_bytes(field.field_type, lower)),
            "upper": comparable(from_bytes(field.field_type, data_file.upper_bounds[field_id])),
            "min": comparable(least["min"].as_py()),
            "max": comparable(least["max"].as_py()),
        }
    return {
        "file": data_file.file_path,
        "rows": data_file.record_count,
        "values": {name(i): n for i, n in (data_file.value_counts or {}).items()},
        "nulls": {name(i): n for i, n in (data_file.null_value_counts or {}).items()},
        "bounds": bounds,
    }


def pruned(table, metrics):
    """What pyiceberg plans for a scan filtered on the first column's least value, against
    the files that hold it: a reader skips a file by its bounds."""
    column = table.schema().fields[0].name
    held = {m["file"]: set(read_file(table, m["file"]).column(column).to_pylist()) for m in metrics}
    every = set().union(*held.values())
    if not every:
        return {"column": column, "files": len(metrics)}
    value = min(every)
    planned = table.scan(row_filter=EqualTo(column, value)).plan_files()
    return {
        "column": column,
        "value": comparable(value),
        "files": len(metrics),
        "planned": len(list(planned)),
        "holding": sum(1 for values in held.values() if value in values),
    }


def internal(value):
    """A row's value as pyiceberg's transforms take it (a timestamp in µs)."""
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1_000_000)
    return value


def partition_of(table, data_file):
    """A data file's partition in its manifest, and its rows' values transformed by the file's
    own spec (each once): equal when every row is in the partition its manifest says."""
    schema = table.schema()
    rows = read_file(table, data_file.file_path).to_pylist()
    found = set()
    for row in rows:
        values = []
        for field in table.specs()[data_file.spec_id].fields:
            source = schema.find_field(field.source_id)
            transform = field.transform.transform(source.field_type)
            values.append(transform(internal(row[source.name])))
        found.add(json.dumps(values))
    return {
        "file": data_file.file_path,
        "partition": list(data_file.partition),
        "spec_id": data_file.spec_id,
        "rows": sorted(json.loads(v) for v in found),
    }


def current(docs, table):
    changes = table.scan().to_duckdb(table_name="changes")
    query = documented_query(docs, "-- The Iceberg changelog's current state")
    return documents_by_key(changes.sql(query))


def main():
    kind = sys.argv[1]
    if kind == "table":
        uri, name, ident = sys.argv[2:5]
        endpoint = sys.argv[5] if len(sys.argv) > 5 else None
        print(json.dumps(read(load_table(uri, name, ident, endpoint))))
    elif kind == "glue-table":
        print(json.dumps(glue_table(*sys.argv[2:5])))
    elif kind == "glue-columns":
        print(json.dumps(glue_columns(*sys.argv[2:5])))
    elif kind == "s3tables-bucket":
        endpoint, name = sys.argv[2:4]
        print(aws("s3tables", endpoint).create_table_bucket(name=name)["arn"])
    elif kind == "s3tables-tables":
        print(json.dumps(s3tables_tables(*sys.argv[2:4])))
    elif kind == "bucket":
        bucket = BucketTransform(int(sys.argv[2])).transform(StringType())
        print(json.dumps([bucket(value) for value in sys.argv[3:]]))
    elif kind == "current":
        docs, uri, name, ident = sys.argv[2:6]
        endpoint = sys.argv[6] if len(sys.argv) > 6 else None
        print(json.dumps(current(docs, load_table(uri, name, ident, endpoint))))
    else:
        sys.exit(f"unknown command {kind}")


if __name__ == "__main__":
    main()
