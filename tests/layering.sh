#!/usr/bin/env bash
# The layering of the libraries, checked on the built archives: every stepcast symbol a library
# uses is defined in that library or in one it may use. A static library links whatever its
# executable happens to pull in, so a call against the layering can link; this test says which.
#   tests/layering.sh LIBRARY=FILE ... -- LIBRARY:ALLOWED,ALLOWED ...
set -euo pipefail
declare -A file_of
while [ $# -gt 0 ] && [ "$1" != "--" ]; do file_of[${1%%=*}]=${1#*=}; shift; done
shift
defined() { nm --defined-only --format=posix "${file_of[$1]}" 2>/dev/null | awk '{print $1}'; }
failures=0
for rule in "$@"; do
  library=${rule%%:*}
  allowed=${rule#*:}
  [ -n "${file_of[$library]:-}" ] || { echo "layering: no file for $library" >&2; exit 2; }
  available=$(mktemp)
  { defined "$library"; for other in ${allowed//,/ }; do defined "$other"; done; } | sort -u >"$available"
  # Undefined symbols of stepcast's namespace (mangled "8stepcast").
  missing=$(nm --undefined-only --format=posix "${file_of[$library]}" 2>/dev/null | awk '{print $1}' |
            grep '8stepcast' | sort -u | comm -23 - "$available" || true)
  rm -f "$available"
  if [ -n "$missing" ]; then
    failures=$((failures + 1))
    echo "layering: $library (may use: ${allowed:-nothing}) uses:"
    echo "$missing" | c++filt | sed 's/^/  /' | head -20
  else
    echo "layering: $library uses only itself and ${allowed:-nothing}"
  fi
done
exit $((failures > 0))
