#!/bin/sh
# Installs plexd from the plexsphere control plane: picks the machine's architecture, downloads
# the binary, checksums.sha256 and its signature from <api>/downloads/plexd, verifies the
# Domain's Ed25519 signature of checksums.sha256 with the Domain key in
# /etc/plexd/domain-signing.pub.pem (PLEXD_SIGNING_KEY), checks the binary with sha256sum, and
# installs it to /usr/local/bin/plexd (0755).
#
# It fails closed: no Domain key, no openssl, or a signature that cannot be fetched or does not
# verify stops the install. PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE=1 installs without a signature
# that cannot be had (never past one that does not verify); it says so loudly. Without the
# signature, anyone between this machine and the control plane can swap the binary.
#
# The broker writes this file to /etc/plexd/install-plexd.sh with the API URL filled in; by hand:
#   sh install-plexd.sh https://plexsphere.example
# Every failure prints one line saying what failed and exits non-zero.
set -eu

api_url=${1:-'@PLEXD_API_URL@'}
dest=${PLEXD_INSTALL_PATH:-/usr/local/bin/plexd}
signing_key=${PLEXD_SIGNING_KEY:-/etc/plexd/domain-signing.pub.pem}
insecure=${PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE:-}

fail() {
    echo "install-plexd: $*" >&2
    exit 1
}

# The signature cannot be checked: stop, unless the operator opted out.
unverifiable() {
    if [ "$insecure" = 1 ]; then
        echo "install-plexd: WARNING: $1; installing WITHOUT a verified signature because PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE=1 (anyone on the path to the API could have swapped plexd)" >&2
        return 0
    fi
    fail "$1; refusing to install an unverified plexd. $2 (or, insecurely, set PLEXD_INSTALL_INSECURE_SKIP_SIGNATURE=1)"
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

if [ ! -f "$signing_key" ]; then
    unverifiable "no Domain signing key at $signing_key" \
        "Write the Domain's key there (plexctl domain list shows it; docs/downloads.md says how) or point PLEXD_SIGNING_KEY at it"
elif ! command -v openssl >/dev/null 2>&1; then
    unverifiable "openssl is not installed, so the signature of checksums.sha256 cannot be checked" \
        "Install openssl (3.0 or later) and run this again"
elif ! curl -fsS --retry 3 -o checksums.sha256.sig "$base/checksums.sha256.sig" 2>/dev/null; then
    unverifiable "cannot fetch $base/checksums.sha256.sig (the server or something on the way did not serve it)" \
        "Check that the server signs its downloads (plexsphere --plexd-signing-domain) and that this machine reaches it directly"
elif ! openssl pkeyutl -verify -pubin -inkey "$signing_key" -rawin -in checksums.sha256 \
    -sigfile checksums.sha256.sig >/dev/null 2>&1; then
    fail "the signature of checksums.sha256 does not verify with the Domain key in $signing_key; refusing to install (the download was tampered with, or the key is another Domain's)"
else
    echo "install-plexd: checksums.sha256 is signed by the Domain key in $signing_key"
fi

grep " plexd-linux-$arch\$" checksums.sha256 >expected.sha256 ||
    fail "checksums.sha256 from $base lists no plexd-linux-$arch"
sha256sum -c - <expected.sha256 >/dev/null 2>&1 ||
    fail "plexd-linux-$arch does not match its checksum in checksums.sha256; the download is corrupt or tampered with"

dest_dir=$(dirname "$dest")
mkdir -p "$dest_dir" || fail "cannot create $dest_dir"
# Install beside the target, then rename: a running plexd is never left half-written.
cp "plexd-linux-$arch" "$dest.new" || fail "cannot write $dest.new"
chmod 0755 "$dest.new" || fail "cannot make $dest.new executable"
mv -f "$dest.new" "$dest" || fail "cannot move plexd into place at $dest"
echo "install-plexd: installed plexd ($arch) from $base to $dest"
