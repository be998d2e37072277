#!/usr/bin/env bash
# Install every Debian package QueueBox builds, tests and benchmarks with
# (Go and the Go client's test drivers too: clients/go/test.sh builds
# against their sources, no module proxy),
# Node with npm, and the npm packages of test/node and test/browser (from
# their lockfiles; Debian's chromium is the console test's browser, driven
# by playwright-core: no browser download);
# where the .NET SDK is installed (it is no Debian package), the NuGet
# packages of clients/dotnet, into clients/dotnet/packages, and those of
# tools/tsql-check (the T-SQL parser check), into tools/tsql-check/packages.
# Idempotent: packages already present are skipped by apt-get.  Needs root
# (or sudo).  Later issues' libraries (brokers, FreeTDS, jq) are installed
# now too, so one set-up serves every milestone.  nftables, iproute2 and
# util-linux (nft, ip, unshare, nsenter) make TAP 048's network faults.
# bison and flex build PostgreSQL from its tarball (scripts/pg-majors.sh).
# debhelper, postgresql-server-dev-all (pg_buildext's) and lintian make the
# Debian packages (make deb; TAP 059 installs them).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

PKGS=(
  build-essential pkg-config make gcc
  clang libclang-rt-14-dev
  postgresql-15 postgresql-server-dev-15 postgresql-client-15 libpq-dev
  libcurl4-openssl-dev libjansson-dev libyaml-dev libssl-dev libcmocka-dev
  libipc-run-perl libdbd-odbc-perl libmicrohttpd-dev
  librabbitmq-dev librdkafka-dev libnats-dev freetds-dev unixodbc-dev tdsodbc libjq-dev
  curl wrk openssl valgrind
  golang-go golang-github-lib-pq-dev golang-github-denisenkom-go-mssqldb-dev
  systemd
  rabbitmq-server nats-server pgbouncer
  nftables iproute2 util-linux
  bison flex
  debhelper postgresql-server-dev-all lintian
  chromium
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # The Debian package would start a cluster of its own; we never use it.
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# Node and npm for the receivers' libraries the TAP tests verify signatures
# with (test/node).  A node that is already there (say from NodeSource,
# whose nodejs carries its own npm) is kept: Debian's npm would conflict.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
# Their packages, from the lockfile; again only when it changed.
for NODE_DIR in "$(dirname "$0")/../test/node" "$(dirname "$0")/../test/browser"; do
  if [ ! "$NODE_DIR/node_modules/.package-lock.json" -nt "$NODE_DIR/package-lock.json" ]; then
    echo "setup: npm ci in ${NODE_DIR#*/../}"
    npm ci --prefix "$NODE_DIR" --no-audit --no-fund
  fi
done

# The C# library's NuGet packages, into clients/dotnet/packages: TAP 039
# restores from there offline, as the postgres user, with a home of its own.
# Only where dotnet is installed (the .NET 10 SDK: packages.microsoft.com's
# dotnet-sdk-10.0, or dot.net/v1/dotnet-install.sh), and only when a project
# file changed since the last restore.
DOTNET_DIR="$(cd "$(dirname "$0")/.." && pwd)/clients/dotnet"
if command -v dotnet >/dev/null; then
  stamp="$DOTNET_DIR/packages/.restored"
  if [ ! -e "$stamp" ] || [ -n "$(find "$DOTNET_DIR" -path "$DOTNET_DIR/packages" -prune -o \( -name '*.csproj' -o -name '*.props' -o -name '*.slnx' \) -newer "$stamp" -print)" ]; then
    echo "setup: dotnet restore in clients/dotnet (into clients/dotnet/packages)"
    DOTNET_NOLOGO=1 DOTNET_CLI_TELEMETRY_OPTOUT=1 NUGET_PACKAGES="$DOTNET_DIR/packages" \
      dotnet restore "$DOTNET_DIR/QueueBox.Inbox.slnx"
    touch "$stamp"
  fi
else
  echo "setup: dotnet is not installed: the C# tests (TAP 039) will be skipped; install the .NET 10 SDK to run them"
fi

# The T-SQL checker's NuGet package (tools/tsql-check: ScriptDom), into
# tools/tsql-check/packages: its run.sh restores from there offline.  Its
# check is not skipped without dotnet: scripts/test.sh fails, saying so.
TSQL_DIR="$(cd "$(dirname "$0")/.." && pwd)/tools/tsql-check"
if command -v dotnet >/dev/null; then
  stamp="$TSQL_DIR/packages/.restored"
  if [ ! -e "$stamp" ] || [ "$TSQL_DIR/tsql-check.csproj" -nt "$stamp" ]; then
    echo "setup: dotnet restore in tools/tsql-check (into tools/tsql-check/packages)"
    DOTNET_NOLOGO=1 DOTNET_CLI_TELEMETRY_OPTOUT=1 NUGET_PACKAGES="$TSQL_DIR/packages" \
      dotnet restore "$TSQL_DIR/tsql-check.csproj"
    touch "$stamp"
  fi
else
  echo "setup: dotnet is not installed: the T-SQL check of scripts/test.sh (tools/tsql-check) will fail; install the .NET 10 SDK"
fi
