#!/usr/bin/env python3
"""The tests' Iceberg REST catalog: the routes of the Iceberg REST catalog API a writer and a
reader use, served over pyiceberg's own SqlCatalog (PyPI; scripts/test.sh installs it), so
that every rule of a commit — its requirements checked against the table, its updates
applied, the new metadata written, the catalog row swapped — is pyiceberg's, not ours. No
REST catalog server is packaged in the registries here (Polaris, Lakekeeper, Nessie and
Gravitino are JVM or container images); Apache Iceberg's own REST test fixture is built the
same way, over its JDBC catalog.

    iceberg_rest.py --port P --catalog sqlite:////path/catalog.db --warehouse DIR
        [--prefix P] [--warehouse-name W] [--token T] [--client ID:SECRET] [--expires-in S]
        [--tokens-last S] [--token-path /P] [--scope S] [--namespaces A,B]
        [--no-namespace-creation]
        [--fail-every N] [--lose-every N] [--s3-endpoint URL]

Routes (under /v1, and the prefix when given): GET config; POST oauth/tokens (the
client-credentials grant, when --client is given); GET, POST namespaces; GET, HEAD
namespaces/{ns}; POST namespaces/{ns}/register; GET, HEAD, POST namespaces/{ns}/tables/{t}
(load; commit). GET /health answers 200 without authentication.

Authentication: with --token, every route but config's and the token endpoint's takes only
`Authorization: Bearer <T>`; with --client, the tokens the token endpoint issued for that
client (at --token-path instead of v1/oauth/tokens when given: an identity provider of its
own; only for the scope --scope when given), each said to last --expires-in seconds (default 3600) and taken for --tokens-last
seconds (default: as long as it is said to). A refused request is 401.

--namespaces makes those namespaces at the start; --no-namespace-creation refuses to make any
more (403: a principal without that grant).

Faults: --fail-every N answers every Nth request under /v1 503 without doing it;
--lose-every N does every Nth commit, then answers it 502 (its answer lost).
Every request is logged on stderr as `<method> <path> <status>`, a refusal with its error.
"""
import argparse
import json
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import CommitTableRequest

args = None
catalog = None
lock = threading.Lock()
issued = {}
counts = {"requests": 0, "commits": 0}


def error(status, kind, message):
    return status, {"error": {"message": message, "type": kind, "code": status}}


def table_result(table):
    return {
        "metadata-location": table.metadata_location,
        "metadata": json.loads(table.metadata.model_dump_json()),
        "config": {},
    }


def namespace_of(segment):
    return tuple(urllib.parse.unquote(segment).split("\x1f"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *rest):
        pass

    def answer(self, status, body):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        said = ""
        if status >= 400 and isinstance(body, dict) and isinstance(body.get("error"), dict):
            said = f" {body['error'].get('type')}: {body['error'].get('message')}"
        print(f"{self.command} {self.path} {status}{said}", file=sys.stderr, flush=True)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def authorized(self):
        if not (args.token or args.client):
            return True
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            return False
        token = given[len("Bearer "):]
        if args.token and token == args.token:
            return True
        expires = issued.get(token)
        return expires is not None and time.time() < expires

    def handle_any(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/health":
            return self.answer(200, {})
        if args.token_path and url.path == args.token_path and self.command == "POST":
            return self.answer(*self.grant(self.body()))
        parts = [p for p in url.path.split("/") if p]
        if parts[:1] != ["v1"]:
            return self.answer(*error(404, "NotFoundException", f"no route {url.path}"))
        parts = parts[1:]
        body = self.body()
        with lock:
            counts["requests"] += 1
            if args.fail_every and counts["requests"] % args.fail_every == 0:
                return self.answer(*error(503, "ServiceUnavailableException", "slow down"))
            if parts == ["config"]:
                query = urllib.parse.parse_qs(url.query)
                if args.warehouse_name and query.get("warehouse") != [args.warehouse_name]:
                    return self.answer(*error(400, "BadRequestException", "no such warehouse"))
                overrides = {"prefix": args.prefix} if args.prefix else {}
                return self.answer(200, {"defaults": {}, "overrides": overrides})
            if parts == ["oauth", "tokens"] and self.command == "POST" and not args.token_path:
                return self.answer(*self.grant(body))
            if not self.authorized():
                return self.answer(*error(401, "NotAuthorizedException", "not authorized"))
            if args.prefix:
                prefix = args.prefix.split("/")
                if parts[: len(prefix)] != prefix:
                    return self.answer(*error(404, "NotFoundException", f"no route {url.path}"))
                parts = parts[len(prefix):]
            try:
                return self.answer(*self.route(parts, body))
            except (NoSuchTableError, NoSuchNamespaceError) as e:
                return self.answer(*error(404, type(e).__name__, str(e)))
            except (TableAlreadyExistsError, NamespaceAlreadyExistsError) as e:
                return self.answer(*error(409, "AlreadyExistsException", str(e)))
            except CommitFailedException as e:
                return self.answer(*error(409, "CommitFailedException", str(e)))
            except ValueError as e:
                return self.answer(*error(400, "BadRequestException", str(e)))

    def grant(self, body):
        form = urllib.parse.parse_qs(body.decode())
        given = (form.get("client_id", [""])[0], form.get("client_secret", [""])[0])
        if not args.client or form.get("grant_type") != ["client_credentials"]:
            return 400, {"error": "unsupported_grant_type"}
        if ":".join(given) != args.client:
            return 401, {"error": "invalid_client", "error_description": "unknown client"}
        if args.scope and form.get("scope") != [args.scope]:
            return 400, {"error": "invalid_scope", "error_description": "scope not granted"}
        token = secrets.token_hex(16)
        issued[token] = time.time() + (args.tokens_last or args.expires_in)
        return 200, {
            "access_token": token,
            "token_type": "bearer",
            "expires_in": args.expires_in,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }

    def route(self, parts, body):
        method = self.command
        if parts == ["namespaces"]:
            if method == "GET":
                return 200, {"namespaces": [list(n) for n in catalog.list_namespaces()]}
            if args.no_namespace_creation:
                return error(403, "ForbiddenException", "not allowed to create namespaces")
            request = json.loads(body)
            namespace = tuple(request["namespace"])
            catalog.create_namespace(namespace, request.get("properties") or {})
            return 200, {"namespace": list(namespace), "properties": {}}
        if len(parts) == 2 and parts[0] == "namespaces":
            namespace = namespace_of(parts[1])
            return 200, {
                "namespace": list(namespace),
                "properties": catalog.load_namespace_properties(namespace),
            }
        if len(parts) == 3 and parts[2] == "register" and method == "POST":
            request = json.loads(body)
            ident = namespace_of(parts[1]) + (request["name"],)
            return 200, table_result(catalog.register_table(ident, request["metadata-location"]))
        if len(parts) == 4 and parts[2] == "tables":
            ident = namespace_of(parts[1]) + (urllib.parse.unquote(parts[3]),)
            table = catalog.load_table(ident)
            if method in ("GET", "HEAD"):
                return 200, table_result(table)
            request = CommitTableRequest.model_validate_json(body)
            response = catalog.commit_table(table, request.requirements, request.updates)
            counts["commits"] += 1
            if args.lose_every and counts["commits"] % args.lose_every == 0:
                return error(502, "BadGatewayException", "the answer was lost")
            return 200, {
                "metadata-location": response.metadata_location,
                "metadata": json.loads(response.metadata.model_dump_json()),
            }
        return error(404, "NotFoundException", f"no route {'/'.join(parts)}")

    do_GET = do_POST = do_HEAD = do_DELETE = handle_any


def main():
    global args, catalog
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--prefix")
    parser.add_argument("--warehouse-name")
    parser.add_argument("--token")
    parser.add_argument("--client")
    parser.add_argument("--expires-in", type=int, default=3600)
    parser.add_argument("--tokens-last", type=float, default=0)
    parser.add_argument("--token-path")
    parser.add_argument("--scope")
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--lose-every", type=int, default=0)
    parser.add_argument("--s3-endpoint")
    parser.add_argument("--namespaces", default="")
    parser.add_argument("--no-namespace-creation", action="store_true")
    args = parser.parse_args()
    properties = {"uri": args.catalog, "warehouse": args.warehouse}
    if args.s3_endpoint:
        properties.update(
            {
                "s3.endpoint": args.s3_endpoint,
                "s3.access-key-id": "testing",
                "s3.secret-access-key": "testing",
                "s3.region": "us-east-1",
            }
        )
    catalog = SqlCatalog("rest", **properties)
    for namespace in filter(None, args.namespaces.split(",")):
        catalog.create_namespace_if_not_exists(namespace)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
