#!/usr/bin/env bash
# clients/go/test.sh: vet, format check, build and test the Go pull worker
# against Debian 12's Go sources (golang-go 1.19, golang-github-lib-pq-dev,
# golang-github-denisenkom-go-mssqldb-dev; scripts/setup.sh installs them):
# no module proxy is needed.  GOPATH mode, the package linked into a
# temporary GOPATH beside /usr/share/gocode; go.mod states the same
# versions for a build with a proxy.
#
#   clients/go/test.sh [go test flags...]     vet, gofmt, go test (the scenarios need
#                                            QBI_TEST_PGHOST/QBI_TEST_PGPORT, TAP 034 sets them)
#   clients/go/test.sh --build-worker OUT     only build the test worker (TAP 034, bench/pull)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PKG=github.com/alternayte/queuebox/clients/go
GP=$(mktemp -d "${TMPDIR:-/tmp}/qb-go.XXXXXX")
trap 'rm -rf "$GP"' EXIT
mkdir -p "$GP/src/$(dirname "$PKG")"
ln -s "$HERE" "$GP/src/$PKG"
export GO111MODULE=off GOPATH="$GP:/usr/share/gocode"
# the build cache: the caller's, else one for this run (TAP runs as postgres)
export GOCACHE=${GOCACHE:-$GP/cache}
cd "$GP/src/$PKG"
if [ "${1:-}" = "--build-worker" ]; then
  go build -o "$2" ./internal/testworker
  exit 0
fi
unformatted=$(gofmt -l . || true)
if [ -n "$unformatted" ]; then
  echo "gofmt: not formatted: $unformatted" >&2
  exit 1
fi
go vet ./...
go test "$@" ./...
