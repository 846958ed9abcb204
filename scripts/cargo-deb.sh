# Sourced: makes cargo-deb (pinned) available as "$CARGO_DEB", installing it once into a cache
# outside the checkout (~/.cache/ddbpipe/tools/cargo-deb-<version>, beside the build cache of
# scripts/test.sh) with the crates registry's tested lockfile. A cold install takes about 4
# minutes on 2 cores; later runs reuse the binary.
CARGO_DEB_VERSION=3.8.0
CARGO_DEB_ROOT="${DDBPIPE_TOOLS:-$HOME/.cache/ddbpipe/tools}/cargo-deb-$CARGO_DEB_VERSION"
CARGO_DEB="$CARGO_DEB_ROOT/bin/cargo-deb"
if ! "$CARGO_DEB" --version 2>/dev/null | grep -qx "cargo-deb $CARGO_DEB_VERSION"; then
  echo "installing cargo-deb $CARGO_DEB_VERSION into $CARGO_DEB_ROOT" >&2
  # Its own temporary build directory, not the workspace's build cache.
  env -u CARGO_TARGET_DIR cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION" \
    --root "$CARGO_DEB_ROOT"
fi
export CARGO_DEB
