#!/usr/bin/env bash
# `make setup`, first step: the Debian packages of requirements-os.txt (and python3-venv where Python lacks venv),
# installed when missing; podman's runtime set to runc. As root it does it; otherwise it prints the command and stops.
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=$(sed -e 's/#.*//' requirements-os.txt | tr -s ' \n' ' ')
if ! command -v dpkg > /dev/null; then
  echo "os-setup: not a Debian-based system; install the equivalents of:$packages (and python3 venv support)" >&2
  exit 0
fi
missing=""
for package in $packages; do
  # "installed", not just known to dpkg: a package removed but not purged still answers `dpkg -s`
  [ "$(dpkg-query -W -f='${Status}' "$package" 2> /dev/null)" = "install ok installed" ] || missing="$missing $package"
done
python3 -c 'import ensurepip' 2> /dev/null || missing="$missing python3-venv"

conf=/etc/containers/containers.conf
needs_runc=true
grep -qs '^ *runtime *= *"runc"' "$conf" && needs_runc=false

if [ -z "$missing" ] && ! $needs_runc; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "os-setup: missing Debian packages:$missing" >&2
  [ -n "$missing" ] && echo "  run as root: apt-get update && apt-get install -y$missing" >&2
  $needs_runc && echo "  and set podman's runtime: printf '[engine]\\nruntime = \"runc\"\\n' >> $conf" >&2
  echo "  then run make setup again" >&2
  exit 1
fi
if [ -n "$missing" ]; then
  echo "os-setup: installing$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing > /dev/null
  # the lab starts its own Prometheus on 127.0.0.1 (tests/sim/prometheus_lab.py): the package's daemons, listening on
  # every address, are not wanted on a machine that installed them only for this
  if [[ " $missing " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service prometheus-node-exporter.service > /dev/null 2>&1 || true
  fi
fi
if $needs_runc; then
  mkdir -p /etc/containers
  if grep -qs '^\[engine\]' "$conf"; then
    sed -i '/^\[engine\]/a runtime = "runc"' "$conf"
  else
    printf '[engine]\nruntime = "runc"\n' >> "$conf"
  fi
  echo "os-setup: podman's runtime set to runc ($conf)"
fi
