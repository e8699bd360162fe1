//! In-memory devices exchanging real WireGuard messages, with time stepped by the test: every
//! case runs once with boringtun's state machine and once with plexd's own
//! (`plexd_dataplane::noise`), which must behave the same on the wire.

mod boringtun_protocol {
    const PROTOCOL: plexd_dataplane::Protocol = plexd_dataplane::Protocol::Boringtun;
    mod cases {
        include!("pipeline/cases.rs");
    }
}

mod plexd_protocol {
    const PROTOCOL: plexd_dataplane::Protocol = plexd_dataplane::Protocol::Plexd;
    mod cases {
        include!("pipeline/cases.rs");
    }
}
