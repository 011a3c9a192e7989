#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when they are missing.
# Usage: scripts/ensure-packages.sh COMMAND_OR_FILE:PACKAGE ...
#   Each argument names something to look for (a command on PATH, or an
#   absolute path) and the Debian package that provides it.
set -euo pipefail

missing=()
for want in "$@"; do
  probe=${want%%:*}
  package=${want#*:}
  if [[ $probe == /* ]]; then
    [[ -e $probe ]] && continue
  else
    command -v "$probe" >/dev/null 2>&1 && continue
  fi
  missing+=("$package")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "ensure-packages: installing ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
  sudo=sudo
else
  sudo=
fi
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y --no-install-recommends "${missing[@]}"; then
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
