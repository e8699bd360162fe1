//! The console's files, compiled into the binary (no Node, no build step, nothing read from
//! disk at run time). Adding a file to `control-plane/console/` means adding its row here;
//! a test checks every file under that folder has one.

/// One embedded file.
#[derive(Debug)]
pub(crate) struct Asset {
    /// The URL path it is served at.
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: concat!("/", $path),
            content_type: $type,
            body: include_bytes!(concat!("../../console/", $path)),
        }
    };
}

/// `index.html`: what every console path (`/`, `/nodes/ID`, ...) answers.
pub(crate) const INDEX: Asset = asset!("index.html", HTML);

/// Everything under `/assets/`.
pub(crate) const ASSETS: &[Asset] = &[
    asset!("assets/app.css", CSS),
    asset!("assets/app.js", JS),
    asset!("assets/api.js", JS),
    asset!("assets/dom.js", JS),
    asset!("assets/events.js", JS),
    asset!("assets/session.js", JS),
    asset!("assets/pages/common.js", JS),
    asset!("assets/pages/nodes.js", JS),
    asset!("assets/pages/node.js", JS),
    asset!("assets/pages/map.js", JS),
    asset!("assets/pages/tokens.js", JS),
    asset!("assets/pages/resources.js", JS),
    asset!("assets/pages/relays.js", JS),
    asset!("assets/pages/audit.js", JS),
    asset!("assets/pages/policy.js", JS),
    asset!("assets/pages/signin.js", JS),
];

/// The asset served at `path`, if any.
pub(crate) fn find(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}
