//! plexd's configuration file (YAML from the operator or cloud-init): any text either parses
//! into a config whose validation holds, or is refused with an error; it never panics.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use plexd::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/plexd/config.yaml");
    if let Ok(config) = Config::parse(text, path) {
        // What the daemon asks next of a parsed config must not panic either.
        let _ = config.require_api_url(path);
    }
});
