//! The userspace data plane's UAPI (`wg set`/`wg show` through the control socket): any request
//! text either parses or is refused with the errno wireguard-go would answer; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexd_dataplane::uapi::{Request, parse_request};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_request(text.lines()) {
        Ok(Request::Get) | Ok(Request::Set(_)) => {}
        Err(e) => assert!(e.errno() < 0),
    }
});
