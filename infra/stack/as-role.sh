#!/usr/bin/env bash
# infra/stack/as-role.sh USER COMMAND...: runs COMMAND as the team stack's OS user USER (its own groups), never
# as root; infra/local-stack.sh starts each role through it.
#   infra/stack/as-role.sh check USER   -> exit 0 where USER can run the checkout's interpreter (or be given it)
# The checkout's venv may run an interpreter kept where USER cannot reach (pyenv's under /root, mode 700).
# Then COMMAND runs in a mount namespace of its own in which the folder that blocks USER is an empty tmpfs
# holding only the interpreter's installation, bound back at its own path: USER runs the very Python the
# venv names and sees nothing else of that folder. Where neither holds, `check` says why and fails.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
python="$here/.venv/bin/python"

as_user() { local user=$1; shift; setpriv --reuid "$user" --regid "$(id -g "$user")" --init-groups "$@"; }

# the interpreter's installation (sys.base_prefix: its binary, libraries and standard library)
prefix=$("$python" -c 'import os, sys; print(os.path.realpath(sys.base_prefix))')
stdlib=$("$python" -c 'import os, sysconfig; print(os.path.realpath(sysconfig.get_paths()["stdlib"]))')

blocking() {  # USER PATH: the outermost folder on PATH that USER cannot enter, empty if none
  local user=$1 path=$2 walked=""
  IFS=/ read -ra parts <<<"${path#/}"
  for part in "${parts[@]}"; do
    walked="$walked/$part"
    if [ -d "$walked" ] && ! as_user "$user" test -x "$walked"; then echo "$walked"; return; fi
  done
}

reaches() { as_user "$1" test -r "$stdlib/os.py"; }

if [ "${1:-}" = check ]; then
  user=$2
  if ! as_user "$user" test -r "$here/flows/__init__.py"; then
    echo "local-stack: the team stack's user $user cannot read the checkout $here; clone it where every user may read" >&2
    exit 2
  fi
  reaches "$user" && exit 0
  if unshare --mount --propagation private true 2>/dev/null; then exit 0; fi
  echo "local-stack: the team stack's user $user cannot run the venv's interpreter ($prefix: $(blocking "$user" "$prefix") is closed to it) and mount namespaces are not allowed here to give it that interpreter alone; make the venv from an interpreter every user can run (make install PYTHON=...)" >&2
  exit 2
fi

user=$1; shift
if reaches "$user"; then exec setpriv --reuid "$user" --regid "$(id -g "$user")" --init-groups "$@"; fi
block=$(blocking "$user" "$prefix")
exec unshare --mount --propagation private bash -c '
  set -euo pipefail
  keep=$1 block=$2 user=$3 group=$4; shift 4
  stage=$(mktemp -d /tmp/privzo-interpreter-XXXXXX)
  mount --bind "$keep" "$stage"
  mount -t tmpfs -o mode=711,size=1m privzo-hidden "$block"
  (umask 022 && mkdir -p "$keep")
  mount --bind "$stage" "$keep"
  umount "$stage" && rmdir "$stage"
  exec setpriv --reuid "$user" --regid "$group" --init-groups "$@"' as-role "$prefix" "$block" "$user" \
  "$(id -g "$user")" "$@"
