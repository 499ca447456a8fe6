#!/usr/bin/env bash
# Return `labkit grade`'s feedback to each learner of the one-machine hub, as root:
#   hub/return-feedback.sh lab01_baseline grades/     # grades/feedback/<login>.md -> ~<login>/labkit/feedback/<lab>.md
# Written AS the learner (runuser), mode 0600, so only they read it and a planted link cannot redirect root's write.
set -euo pipefail
lab=${1:?usage: return-feedback.sh LAB GRADES}; grades=${2:?usage: return-feedback.sh LAB GRADES}
group=${LABKIT_HUB_LEARNERS:-learners}
for login in $(getent group "$group" | cut -d: -f4 | tr , ' '); do
  md="$grades/feedback/$login.md"
  [ -f "$md" ] || { echo "return-feedback.sh: no feedback for $login" >&2; continue; }
  home=$(getent passwd "$login" | cut -d: -f6)
  runuser -u "$login" -- bash -c 'umask 077; mkdir -p "$1" && cat > "$1/$2.md"' _ "$home/labkit/feedback" "$lab" < "$md"
  echo "return-feedback.sh: $login"
done
