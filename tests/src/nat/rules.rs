//! What a router does to its LAN's traffic ([`NatMode`]) and the nftables ruleset of each.

/// What a router does to traffic leaving its LAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatMode {
    /// `masquerade`: the source port is kept when free, so a host's mapping is the same
    /// towards every destination (endpoint-independent mapping). Filtering is Linux
    /// conntrack's: only the exact remote address and port of an outbound flow gets in.
    Eim,
    /// `masquerade` as [`NatMode::Eim`], but the router's own input accepts what arrives
    /// unsolicited on its WAN side (as many Linux NAT gateways and cloud NAT instances do):
    /// a datagram that reaches the router's public port before the inside host sent to its
    /// source creates a conntrack entry of the router's own, and the host's later mapping
    /// towards that source takes another port (the tuple is taken). "EIM, input accept".
    EimInputAccept,
    /// `masquerade random`: a fresh port per destination (endpoint-dependent mapping).
    Edm,
    /// `masquerade`, and every UDP datagram forwarded outwards dropped; TCP passes.
    DropUdp,
    /// Routing only: no translation, the LAN is routed on the public segment.
    None,
}

/// The nftables table every router's ruleset lives in.
const NAT_TABLE: &str = "pxnat";

/// The nftables ruleset a router in `mode` loads (it replaces whatever was there).
pub fn ruleset(mode: NatMode) -> String {
    let masquerade = match mode {
        NatMode::Eim | NatMode::EimInputAccept | NatMode::DropUdp => "oifname \"wan\" masquerade",
        NatMode::Edm => "oifname \"wan\" masquerade random",
        NatMode::None => "",
    };
    let drop_udp = if mode == NatMode::DropUdp {
        "oifname \"wan\" meta l4proto udp drop"
    } else {
        ""
    };
    // A home router's firewall: nothing new reaches the router itself from the WAN side.
    let input = if mode == NatMode::EimInputAccept {
        ""
    } else {
        "iifname \"wan\" ct state new drop"
    };
    // One statement a line; a chain may not be named `fwd` (an nft keyword).
    format!(
        "flush ruleset
table ip {NAT_TABLE} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    {masquerade}
  }}
  chain inbound {{
    type filter hook input priority filter; policy accept;
    {input}
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    {drop_udp}
  }}
}}
"
    )
}
