#!/bin/sh
# Build the collector distribution of builder.yaml (or reuse the one built
# before) and print the binary's path as the last line.
#
#   sh collector-config/build-otelcol.sh        # what `make otelcol` runs
#
# OTELCOL_BIN, when set, is used as it is: nothing is built. Otherwise the
# binary lives under ${XDG_CACHE_HOME:-$HOME/.cache}/prime-runs-otel/, in a
# folder named after the SHA-256 of the manifest, so a second call is instant
# and an edited manifest builds anew. Needs Go (1.24 or newer) and the Go
# module proxy; the OpenTelemetry Collector Builder is installed next to the
# binary at the release the manifest names.
#
# OTELCOL_QUICK_BUILD=1 (what `make test` sets) compiles without the Go
# compiler's optimizations: about a third less CPU for a binary that runs
# slower, which the tests do not notice and a deployment or a benchmark
# would. It is kept in a folder of its own, and an optimized build of the
# same manifest, when there is one, is taken instead.
#
# One build at a time per manifest: a second call waits for the build under
# way and takes its binary, or reports that it failed (and why) instead of
# building again.
set -eu

if [ -n "${OTELCOL_BIN:-}" ]; then
    if [ ! -x "$OTELCOL_BIN" ]; then
        echo "OTELCOL_BIN=$OTELCOL_BIN is not an executable file: point it at an" \
            "otelcol-contrib (or otelcol-prime-runs) binary, or unset it to build one." >&2
        exit 1
    fi
    echo "$OTELCOL_BIN"
    exit 0
fi

here=$(cd "$(dirname "$0")" && pwd)
manifest="$here/builder.yaml"
hash=$(sha256sum "$manifest" | cut -c1-16)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/prime-runs-otel"
optimized="$cache/otelcol-$hash/otelcol-prime-runs/otelcol-prime-runs"
target="$cache/otelcol-$hash"
gcflags=""
if [ -n "${OTELCOL_QUICK_BUILD:-}" ]; then
    target="$cache/otelcol-$hash-quick"
    gcflags="all=-N -l"
fi
binary="$target/otelcol-prime-runs/otelcol-prime-runs"

for built in "$optimized" "$binary"; do
    if [ -x "$built" ]; then
        echo "$built"
        exit 0
    fi
done

if command -v flock >/dev/null 2>&1; then
    mkdir -p "$cache"
    exec 9>"$target.lock"
    if ! flock -n 9; then
        echo "Waiting for the collector build under way in $target ..." >&2
        flock 9
        if [ -x "$binary" ]; then
            echo "$binary"
            exit 0
        fi
        if [ -f "$target.failed" ]; then
            cat "$target.failed" >&2
            echo "The collector build this call waited for failed (log above)." >&2
            exit 1
        fi
    fi
    rm -f "$target.failed"
fi

if ! command -v go >/dev/null 2>&1; then
    echo "Go is needed to build the collector (https://go.dev/dl/, 1.24 or newer)." \
        "Or set OTELCOL_BIN to an otelcol-contrib binary." >&2
    exit 1
fi

# The Go compiler without garbage collection: a fifth less CPU, and each
# compile still stays near 1 GB.
GOGC="${GOGC:-off}"
export GOGC

# The builder at the release of the manifest's components (dist.version).
version=$(sed -n 's/^  version: *\([0-9.]*\).*/\1/p' "$manifest" | head -n 1)
if [ -z "$version" ]; then
    echo "$manifest has no dist.version: it names the builder release to use." >&2
    exit 1
fi
# Compiled without optimizations and linked without symbols: the builder
# only writes the distribution's sources and runs `go`, so its speed does
# not matter, and on a fresh machine this takes about a quarter less CPU
# (59 against 81 CPU-s measured). Its output is the same either way.
tools="$cache/builder-v$version"
if [ ! -x "$tools/builder" ]; then
    echo "Installing the OpenTelemetry Collector Builder v$version ..." >&2
    GOBIN="$tools" go install -trimpath -gcflags="all=-N -l" -ldflags="-s -w" \
        "go.opentelemetry.io/collector/cmd/builder@v$version" >&2
fi

# Built in a fresh folder and moved into place whole, so an interrupted or
# concurrent build never leaves a half-written binary where the next call
# would take it.
mkdir -p "$cache"
work=$(mktemp -d "$target.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
echo "Building the collector (a few minutes the first time) in $target ..." >&2
(cd "$work" && GOFLAGS="${GOFLAGS:-} -mod=mod" "$tools/builder" --config "$manifest" \
    --gcflags="$gcflags" >build.log 2>&1) || {
    cp "$work/build.log" "$target.failed"
    cat "$work/build.log" >&2
    echo "Building the collector failed (log above)." >&2
    exit 1
}
if [ -x "$binary" ]; then
    echo "$binary"  # another build finished first
    exit 0
fi
mv "$work" "$target"
trap - EXIT
echo "$binary"
