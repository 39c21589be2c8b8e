#!/usr/bin/env bash
# The bash completion offers every command of `stepcast --help`, each command's options and the
# shipped names; the man page build/stepcast.1 has a section per command (and renders without
# warnings where groff is installed).
#   tests/completion_man.sh BUILD_DIR
set -euo pipefail
build=$1
bin="$build/stepcast"
commands=$("$bin" --help | awk '/^commands:/ { in_list = 1; next } in_list && /^  [a-z]/ { print $1 } in_list && /^$/ { exit }')
[ "$(echo "$commands" | wc -w)" -ge 13 ] || { echo "too few commands in --help: $commands"; exit 1; }
script=$(mktemp)
trap 'rm -f "$script"' EXIT
"$bin" completion bash > "$script"
complete_words() {  # the completions of the words given, the last one being completed
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _stepcast; printf "%s\n" "${COMPREPLY[@]}"' \
    _ "$script" "$@"
}
offered=$(complete_words "$bin" "")
for c in $commands; do
  echo "$offered" | grep -qx "$c" || { echo "completion: command '$c' not offered: $offered"; exit 1; }
done
complete_words "$bin" simulate --from | grep -qx -- --from-megatron || { echo "completion: no --from-megatron"; exit 1; }
complete_words "$bin" plan --glo | grep -qx -- --global-batch-size || { echo "completion: no --global-batch-size"; exit 1; }
complete_words "$bin" simulate --model llama3 | grep -qx llama3-8b || { echo "completion: no shipped model names"; exit 1; }
complete_words "$bin" simulate --topology dgx-h | grep -qx dgx-h100 || { echo "completion: no shipped topology names"; exit 1; }
page="$build/stepcast.1"
[ -s "$page" ] || { echo "no man page at $page"; exit 1; }
head -1 "$page" | grep -q '^\.TH STEPCAST 1' || { echo "man page: no .TH line"; exit 1; }
for c in $commands; do
  grep -qx "\.SS $c" "$page" || { echo "man page: no section for '$c'"; exit 1; }
done
grep -q 'from\\-megatron' "$page" || { echo "man page: --from-megatron missing"; exit 1; }
if command -v groff >/dev/null; then
  warnings=$(groff -k -man -Tutf8 -ww "$page" 2>&1 >/dev/null)  # -k: preconv, as man does
  [ -z "$warnings" ] || { echo "man page: groff warns: $warnings"; exit 1; }
fi
echo "completion and man page: ok ($(echo "$commands" | wc -w) commands)"
