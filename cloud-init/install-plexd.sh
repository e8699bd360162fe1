#!/bin/sh
# Installs plexd from the plexsphere control plane: picks the machine's architecture, downloads
# the binary and checksums.sha256 from <api>/downloads/plexd, checks the binary with sha256sum,
# verifies the Domain's Ed25519 signature of checksums.sha256 when the server serves one and
# openssl can check it, and installs the binary to /usr/local/bin/plexd (0755).
#
# The broker writes this file to /etc/plexd/install-plexd.sh with the API URL filled in; by hand:
#   sh install-plexd.sh https://plexsphere.example
# Every failure prints one line saying what failed and exits non-zero.
set -eu

api_url=${1:-'@PLEXD_API_URL@'}
dest=${PLEXD_INSTALL_PATH:-/usr/local/bin/plexd}
signing_key=${PLEXD_SIGNING_KEY:-/etc/plexd/domain-signing.pub.pem}

fail() {
    echo "install-plexd: $*" >&2
    exit 1
}

case "$api_url" in
http://* | https://*) ;;
*) fail "the API URL '$api_url' is not an http(s) URL; pass it as the first argument" ;;
esac
base="${api_url%/}/downloads/plexd"

machine=$(uname -m)
case "$machine" in
x86_64 | amd64) arch=amd64 ;;
aarch64 | arm64) arch=arm64 ;;
*) fail "this machine's architecture '$machine' has no plexd build (amd64 and arm64 exist)" ;;
esac

command -v curl >/dev/null 2>&1 || fail "curl is not installed; install curl and run this again"
command -v sha256sum >/dev/null 2>&1 || fail "sha256sum is not installed (coreutils); install it and run this again"

work=$(mktemp -d) || fail "cannot create a temporary directory"
trap 'rm -rf "$work"' EXIT
cd "$work" || fail "cannot enter the temporary directory $work"

fetch() {
    curl -fsS --retry 10 --retry-connrefused -o "$2" "$1"
}

fetch "$base/linux-$arch" "plexd-linux-$arch" ||
    fail "downloading $base/linux-$arch failed (curl exit $?); check that this machine reaches the API"
fetch "$base/checksums.sha256" checksums.sha256 ||
    fail "downloading $base/checksums.sha256 failed (curl exit $?); check that this machine reaches the API"

grep " plexd-linux-$arch\$" checksums.sha256 >expected.sha256 ||
    fail "checksums.sha256 from $base lists no plexd-linux-$arch"
sha256sum -c - <expected.sha256 >/dev/null 2>&1 ||
    fail "plexd-linux-$arch does not match its checksum in checksums.sha256; the download is corrupt or tampered with"

if [ ! -f "$signing_key" ]; then
    echo "install-plexd: no Domain signing key at $signing_key; relying on checksums.sha256 alone"
elif ! command -v openssl >/dev/null 2>&1; then
    echo "install-plexd: openssl is not installed; the signature of checksums.sha256 is not checked"
elif ! curl -fsS --retry 3 -o checksums.sha256.sig "$base/checksums.sha256.sig" 2>/dev/null; then
    echo "install-plexd: the server serves no checksums.sha256.sig; relying on checksums.sha256 alone"
else
    openssl pkeyutl -verify -pubin -inkey "$signing_key" -rawin -in checksums.sha256 \
        -sigfile checksums.sha256.sig >/dev/null 2>&1 ||
        fail "the signature of checksums.sha256 does not verify with the Domain key in $signing_key; refusing to install"
    echo "install-plexd: checksums.sha256 is signed by the Domain key"
fi

dest_dir=$(dirname "$dest")
mkdir -p "$dest_dir" || fail "cannot create $dest_dir"
# Install beside the target, then rename: a running plexd is never left half-written.
cp "plexd-linux-$arch" "$dest.new" || fail "cannot write $dest.new"
chmod 0755 "$dest.new" || fail "cannot make $dest.new executable"
mv -f "$dest.new" "$dest" || fail "cannot move plexd into place at $dest"
echo "install-plexd: installed plexd ($arch) from $base to $dest"
