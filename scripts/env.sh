# Sourced by the scripts: where cargo builds. A fixed place outside the clone lets repeated runs
# on one machine reuse the build; it works the same when empty.
if [[ -z "${CARGO_TARGET_DIR:-}" ]]; then
  if mkdir -p /var/cache/plexsphere/target 2>/dev/null && [[ -w /var/cache/plexsphere/target ]]; then
    export CARGO_TARGET_DIR=/var/cache/plexsphere/target
  else
    export CARGO_TARGET_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target"
  fi
fi
export CARGO_TERM_COLOR=never
