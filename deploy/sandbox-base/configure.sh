#!/bin/sh
# Runs as root inside a freshly installed sandbox-base root filesystem (chroot on the local
# runtime, a RUN step in deploy/docker/sandbox-base.Dockerfile): E2B's user model.
#   user `user` (uid/gid 1000, home /home/user, bash), passwordless sudo, /workspace.
# `sudo` itself is torpor's shim (deploy/sandbox-base/sudo, installed as /usr/bin/sudo with the
# real binary diverted to /usr/bin/sudo.distrib): a sandbox has no setuid (bubblewrap mounts
# nosuid and sets no_new_privs), so the shim asks the in-sandbox daemon to run the command as
# the sandbox's root, which is an unprivileged id range on the host.
set -eu
shim=${1:?usage: configure.sh <path of the sudo shim>}
if ! getent group user >/dev/null; then groupadd --gid 1000 user; fi
if ! getent passwd user >/dev/null; then
  useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --shell /bin/bash user
fi
usermod -aG sudo user
printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
mkdir -p /workspace
chown user:user /workspace
chmod 0755 /workspace
if [ ! -e /usr/bin/sudo.distrib ]; then
  dpkg-divert --local --rename --divert /usr/bin/sudo.distrib --add /usr/bin/sudo
fi
install -m 0755 "$shim" /usr/bin/sudo
# Small: no documentation, no package lists (`apt-get update` first, as in any container).
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/share/doc/* /usr/share/man/* \
  /usr/share/info/* /var/log/*.log /var/log/apt/*
