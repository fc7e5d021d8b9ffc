#!/bin/sh
# Runs once, as root, inside the image build (packer's shell provisioner). Installs Java and
# ZooKeeper from Debian, the roq executable to /opt/roq, the shipped config to /etc/roq, and the
# units. Enables nothing role-specific: /opt/roq/bin/roq-configure does that on first boot.
set -eu
src=${ROQ_IMAGE_SRC:-/tmp/roq-image}

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends default-jre-headless zookeeper

# A system user owns the state; the units run as it.
getent group roq >/dev/null || groupadd --system roq
getent passwd roq >/dev/null || useradd --system --gid roq --home-dir /var/lib/roq \
  --no-create-home --shell /usr/sbin/nologin roq

rm -rf /opt/roq
mkdir -p /opt/roq/bin /opt/roq/config /opt/roq/docs
cp -a "$src/roq/." /opt/roq/
chmod 0755 /opt/roq/roq
ln -sf /opt/roq/roq /usr/local/bin/roq
install -m 0755 "$src/files/roq-configure" /opt/roq/bin/roq-configure
install -m 0644 "$src/config/GCM.properties" "$src/config/HCM.properties" /opt/roq/config/
# roq-configure writes /etc/roq/zoo.cfg from it with the listener of the machine's role
install -m 0644 "$src/files/zoo.cfg" /opt/roq/config/zoo.cfg
install -m 0644 "$src/operations.md" /opt/roq/docs/operations.md

# The shipped files are the defaults; roq-configure rewrites /etc/roq from them at first boot.
mkdir -p /etc/roq
install -m 0644 /opt/roq/config/GCM.properties /opt/roq/config/HCM.properties /etc/roq/
install -m 0644 "$src/files/zoo.cfg" /etc/roq/zoo.cfg

install -m 0644 "$src/systemd/roq-gcm.service" "$src/systemd/roq-host.service" \
  "$src/systemd/roq-http.service" "$src/systemd/roq-zookeeper.service" /etc/systemd/system/
systemctl daemon-reload

/opt/roq/roq --version
rm -rf "$src"
