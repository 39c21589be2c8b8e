#!/usr/bin/env bash
# The man page stepcast(1), generated from `stepcast --help` and every command's --help (no
# help2man needed): a NAME, SYNOPSIS and DESCRIPTION, then one subsection per command holding its
# help verbatim. CMake runs it after building stepcast (build/stepcast.1, installed to
# PREFIX/share/man/man1).
#   scripts/stepcast-man.sh STEPCAST > stepcast.1
set -euo pipefail
bin=$1
# roff: backslashes as \e, '-' as \-, a leading '.' or "'" protected by \&.
escape() { sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e 's/^\./\\\&./' -e "s/^'/\\\\\\&'/"; }
version=$("$bin" --version | head -1)
commands=$("$bin" --help | awk '/^commands:/ { in_list = 1; next } in_list && /^  [a-z]/ { print $1 } in_list && /^$/ { exit }')
[ -n "$commands" ] || { echo "stepcast-man.sh: no commands in '$bin --help'" >&2; exit 1; }
echo ".TH STEPCAST 1 \"\" \"$version\" \"User Commands\""
echo ".SH NAME"
echo "stepcast \\- plan, predict and run distributed transformer training"
echo ".SH SYNOPSIS"
echo ".B stepcast"
echo "\\fIcommand\\fR [\\fIoptions\\fR]"
echo ".SH DESCRIPTION"
echo ".nf"
"$bin" --help | escape
echo ".fi"
echo ".SH COMMANDS"
for command in $commands; do
  echo ".SS $command"
  echo ".nf"
  "$bin" "$command" --help | escape
  echo ".fi"
done
echo ".SH FILES"
echo "PREFIX/share/stepcast: the shipped models, topologies, profiles, examples and sweeps, found by name"
echo "(\\-\\-model llama3\\-8b)."
echo ".SH EXIT STATUS"
echo "0 ok, 2 bad input (the message names the file, key, value and what is valid), 3 internal error."
