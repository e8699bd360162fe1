//! What the daemon core tells the routes task.

/// What the core tells the routes task.
#[derive(Debug, Clone, PartialEq)]
pub enum RoutesOp {
    /// `routes:` of the config (start and every reload).
    Config(crate::config::routes::RoutesConfig),
    /// The peers as applied to the interface.
    Peers(std::sync::Arc<Vec<plexsphere_wire::node::PeerSpec>>),
    /// The signed state's routes this node serves, and its relays' and STUN servers'
    /// addresses (kept off an exit's tunnel).
    State {
        served: Vec<plexsphere_wire::routes::ServedRoute>,
        relays: Vec<std::net::IpAddr>,
    },
}
