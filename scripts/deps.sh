#!/usr/bin/env bash
# Installs what building and testing plexd/plexsphere needs on Debian 12 / Ubuntu, from Debian's
# packages only. Idempotent: a machine that has everything gets no apt run at all.
set -euo pipefail

packages=(
  build-essential pkg-config    # the C parts of ring and libsqlite3-sys
  ca-certificates curl
  jq procps util-linux          # scripts/lab: JSON from plexctl, pgrep, nsenter
  iproute2 iputils-ping         # ip netns / veth / tuntap and ping in the end-to-end tests
  sqlite3                       # the daemon tests read the replay window from the database
  systemd                       # systemd-analyze verify of the unit in the tests
  wireguard-tools wireguard-go  # the reference WireGuard peers of the interop tests (`wg`, userspace)
  iperf3                        # the whole-system benchmark
  ncat iptables                 # WireGuard's netns.sh (tests/wireguard-go): its UDP listener and NAT rule
  openssl                       # the install script verifies the checksums signature with it
  shellcheck                    # lints cloud-init/install-plexd.sh
  cloud-init                    # `cloud-init schema` validates the broker's documents
  debootstrap systemd-container # local machines: the Debian base image and systemd-nspawn
  postgresql                    # the store's Postgres backend is tested on a throwaway cluster
  nats-server haproxy           # the HA tests and scripts/ha-lab: the NATS JetStream bus and the load balancer
  python3                       # scripts/import-cycles and scripts/import-rules (the import gates of scripts/test)
  nftables conntrack            # the reach tests' NAT routers (nft rulesets, `conntrack -F`)
  qemu-system-x86               # the kernel-backend tests boot Debian's kernel under TCG
  busybox-static kmod cpio      # scripts/kernel-guest.sh: the guest's initramfs and its modules
  musl-tools                    # scripts/dist: musl-gcc compiles ring's C for x86_64-unknown-linux-musl
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross # scripts/dist: the aarch64 linker and ring's C compiler (and headers)
  qemu-user-static              # tests/tests/portable.rs runs the arm64 binaries under qemu-aarch64-static
  lintian rpmlint rpm           # scripts/package lints the .deb and .rpm files; tests/tests/packages.rs reads the RPMs
  dnsutils knot-dnsutils        # plexd's resolver tests and benchmark ask it with dig and kdig
  chromium chromium-driver      # the console's browser tests and benchmark (tests/src/browser.rs, benches/console-bench.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "deps: missing Debian packages: ${missing[*]}; run as root (sudo) or install them" >&2
    exit 1
  fi
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # cloud-init is installed for its schema validator only: this marker keeps it from ever
  # configuring the host itself.
  mkdir -p /etc/cloud && touch /etc/cloud/cloud-init.disabled
  apt-get update -qq
  # --no-install-recommends: wireguard-tools would otherwise pull a kernel image.
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null; then
  echo "deps: cargo is not on PATH; install Rust 1.95 or later with rustup (https://rustup.rs)" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# scripts/dist: the static musl targets of the portable plexd and plexctl (their crt and libc
# come with the target).
for t in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
  rustup target list --installed | grep -qx "$t" || rustup target add "$t"
done

# systemd-resolved and its NSS module for the Debian machines of tests/tests/dns.rs (their image
# has none): downloaded with the host's apt into a cache, so the tests themselves go to no mirror.
debs=/var/cache/plexsphere/debs
for pkg in systemd-resolved libnss-resolve; do
  if ! compgen -G "$debs/${pkg}_*.deb" >/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then
      mkdir -p "$debs"
      (cd "$debs" && apt-get download -qq "$pkg")
    else
      echo "deps: $pkg's .deb is missing from $debs; run as root" >&2
    fi
  fi
done
# boringtun-cli, the second reference WireGuard peer (interop tests, benchmarks), from crates.io,
# built once into a cache outside the clone.
bt_root=/var/cache/plexsphere/cargo-bin
if ! command -v boringtun-cli >/dev/null && [[ ! -x $bt_root/bin/boringtun-cli ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "deps: building boringtun-cli into $bt_root (cargo install --locked, once)"
    cargo install --locked -q boringtun-cli --root "$bt_root"
  else
    echo "deps: boringtun-cli is missing; run as root or: cargo install --locked boringtun-cli --root $bt_root" >&2
  fi
fi

# The OpenID Provider of the sign-in tests (tests/oidc/provider.mjs): the npm packages of the
# committed lock, installed with `npm ci` into a cache outside the clone, again only when the
# lock changed.
# Debian's nodejs and npm, unless a node with npm is there already (NodeSource's nodejs
# carries its own npm and conflicts with Debian's).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
  else
    echo "deps: nodejs and npm are missing; run as root (sudo) or install them" >&2
  fi
fi
oidc_dir=/var/cache/plexsphere/oidc-provider
oidc_src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tests/oidc" && pwd)
if ! cmp -s "$oidc_src/package-lock.json" "$oidc_dir/package-lock.json" 2>/dev/null \
  || [[ ! -d $oidc_dir/node_modules/oidc-provider ]]; then
  if [[ -w /var/cache/plexsphere || $(id -u) -eq 0 ]]; then
    echo "deps: npm ci of the test OpenID Provider into $oidc_dir"
    mkdir -p "$oidc_dir"
    cp "$oidc_src/package.json" "$oidc_src/package-lock.json" "$oidc_dir/"
    npm ci --prefix "$oidc_dir" --no-audit --no-fund --loglevel=error
  else
    echo "deps: the test OpenID Provider is missing from $oidc_dir; run as root" >&2
  fi
fi
