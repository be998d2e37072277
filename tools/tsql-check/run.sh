#!/usr/bin/env bash
# tools/tsql-check/run.sh [ARGS...]: build the checker offline (its NuGet
# packages from tools/tsql-check/packages, which scripts/setup.sh fills),
# run its own test (test/: broken inputs that must fail as test/expected.txt
# says), then check the repository's texts (sources.txt).  `make tsql-check`
# runs it after writing build/tsql/*.i.  No dotnet, or no packages: it fails,
# saying what to do (this check is not skipped).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DIR=$ROOT/tools/tsql-check
if ! command -v dotnet >/dev/null; then
  echo "tsql-check: dotnet is not installed: install the .NET 10 SDK (dotnet-sdk-10.0), then run scripts/setup.sh" >&2
  exit 1
fi
if [ ! -d "$DIR/packages" ]; then
  echo "tsql-check: $DIR/packages is missing: run scripts/setup.sh (it restores the checker's NuGet packages there)" >&2
  exit 1
fi
export DOTNET_NOLOGO=1 DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1 \
  DOTNET_CLI_WORKLOAD_UPDATE_NOTIFY_DISABLE=1 MSBUILDDISABLENODEREUSE=1 NUGET_PACKAGES="$DIR/packages"
# offline: the only source is the folder scripts/setup.sh filled
cfg=$(mktemp /tmp/tsql-check-nuget.XXXXXX.config)
trap 'rm -f "$cfg"' EXIT
printf '<?xml version="1.0" encoding="utf-8"?>\n<configuration>\n  <packageSources>\n    <clear />\n    <add key="local" value="%s" />\n  </packageSources>\n</configuration>\n' "$DIR/packages" > "$cfg"
out=$(dotnet restore "$DIR/tsql-check.csproj" --configfile "$cfg" 2>&1 \
      && dotnet build "$DIR/tsql-check.csproj" --no-restore -c Release -nologo 2>&1) \
  || { echo "$out"; echo "tsql-check: the checker did not build (above)" >&2; exit 1; }
tool=$DIR/bin/Release/net10.0/tsql-check.dll
# its own test first, quiet when it passes (its inputs fail on purpose)
if ! out=$(dotnet "$tool" --root "$DIR/test" --manifest "$DIR/test/sources.txt" --expect "$DIR/test/expected.txt"); then
  echo "$out"
  echo "tsql-check: its own test failed: the check cannot be trusted (tools/tsql-check/test)" >&2
  exit 1
fi
tail -n 1 <<<"$out"
dotnet "$tool" --root "$ROOT" "$@"
