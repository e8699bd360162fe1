//! Shared set-up for the benches: two configured in-memory devices.
