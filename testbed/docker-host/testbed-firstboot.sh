#!/bin/bash
# Runs before sshd on every boot: make this host's own SSH host keys once (they persist in
# the container, so the controller's known_hosts stays valid) and authorise the controller.
set -euo pipefail
ssh-keygen -A >/dev/null
install -d -m 0700 -o deploy -g deploy /home/deploy/.ssh
install -m 0600 -o deploy -g deploy /etc/specdeploy/authorized_keys /home/deploy/.ssh/authorized_keys
