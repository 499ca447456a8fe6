#!/usr/bin/env bash
# Collect one lab from every learner of the one-machine hub, as root, into nbgrader's layout for `labkit grade`:
#   hub/collect.sh lab01_baseline submissions/      # -> submissions/<login>/lab01_baseline/lab01_baseline.ipynb
# A learner's notebook is ~<login>/labkit/labs/<lab>/<lab>.ipynb (their working copy). It is read AS the
# learner (runuser), so a symbolic link a learner planted cannot make root copy a file the learner may not read.
# The collected copies are root's only (0600 in 0700 folders). Learners without the notebook are listed.
set -euo pipefail
lab=${1:?usage: collect.sh LAB DEST}; dest=${2:?usage: collect.sh LAB DEST}
group=${LABKIT_HUB_LEARNERS:-learners}
members=$(getent group "$group" | cut -d: -f4 | tr , ' ')
umask 077
mkdir -p "$dest"
for login in $members; do
  home=$(getent passwd "$login" | cut -d: -f6)
  src="$home/labkit/labs/$lab/$lab.ipynb"
  mkdir -p "$dest/$login/$lab"
  if runuser -u "$login" -- cat "$src" > "$dest/$login/$lab/$lab.ipynb" 2>/dev/null; then
    echo "collect.sh: $login"
  else
    rm -rf "${dest:?}/$login"; echo "collect.sh: $login has no $src" >&2
  fi
done
