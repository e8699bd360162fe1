//! Utilities for the end-to-end tests.
