#!/usr/bin/env bash
# Make a learner's account for the one-machine hub (hub/jupyterhub_config.py), as root:
#   echo 'ana:her-password' | hub/add-learner.sh          # one "login:password" line per learner on stdin
# Each account gets a home of its own that no other account can read (mode 0700: Debian's useradd would
# make it 0755), is a member of the group $LABKIT_HUB_LEARNERS (default learners; the hub lets only its
# members log in) and gets the password it logs in with (PAM). Refuses a login that already exists.
set -euo pipefail
group=${LABKIT_HUB_LEARNERS:-learners}
[ "$(id -u)" = 0 ] || { echo "add-learner.sh: run as root (it creates system accounts)" >&2; exit 1; }
getent group "$group" >/dev/null || groupadd "$group"
while IFS=: read -r login password; do
  [ -n "$login" ] || continue
  [ -n "$password" ] || { echo "add-learner.sh: no password for $login (want login:password)" >&2; exit 1; }
  if getent passwd "$login" >/dev/null; then echo "add-learner.sh: $login exists already" >&2; exit 1; fi
  useradd --create-home -K HOME_MODE=0700 --shell /bin/bash --groups "$group" "$login"
  chmod 0700 "$(getent passwd "$login" | cut -d: -f6)"
  printf '%s:%s\n' "$login" "$password" | chpasswd
  echo "add-learner.sh: $login (group $group, home 0700)"
done
