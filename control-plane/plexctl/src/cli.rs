//! The command line: global connection flags and one subcommand per operator task.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::cli_broker::{CredentialCommand, ResourceCommand};
pub use crate::operator_tokens::OperatorTokenCommand;
use crate::output::Format;

/// The plexsphere operator CLI: bootstrap tokens, nodes, projects, domains and the broker's
/// resources, cloud credentials and blueprints.
///
/// The server and the operator token come from flags, then the environment (PLEXCTL_SERVER,
/// PLEXCTL_TOKEN, PLEXCTL_TOKEN_FILE, PLEXCTL_CA_FILE, PLEXCTL_CONFIG), then the config file
/// ($XDG_CONFIG_HOME/plexctl/config.yaml or ~/.config/plexctl/config.yaml).
#[derive(Debug, Parser)]
#[command(name = "plexctl", version, about, long_about)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// The plexsphere API, e.g. https://plexsphere.example.com [env: PLEXCTL_SERVER]
    #[arg(long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// An operator token (pxop_...); prefer --token-file, a flag shows in `ps` [env: PLEXCTL_TOKEN]
    #[arg(long, global = true, value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the operator token [env: PLEXCTL_TOKEN_FILE]
    #[arg(long, global = true, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// A PEM file of a CA to trust besides the system store [env: PLEXCTL_CA_FILE]
    #[arg(long, global = true, value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// How to print results
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// The config file to read instead of the default one [env: PLEXCTL_CONFIG]
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Issue, list and revoke the tokens nodes register with (single-use unless --uses)
    #[command(subcommand)]
    BootstrapToken(TokenCommand),
    /// List, show and revoke enrolled nodes
    #[command(subcommand)]
    Node(NodeCommand),
    /// List projects
    #[command(subcommand)]
    Project(ListCommand),
    /// List domains, their signing keys, and rotate a Domain's signing key
    #[command(subcommand)]
    Domain(DomainCommand),
    /// Show, test, change, explain and roll back a Domain's access policy (docs/policy.md)
    #[command(subcommand)]
    Policy(crate::policy::PolicyCommand),
    /// Show and set a Domain's DNS suffix (nodes answer `<name>.<suffix>`, docs/dns.md)
    #[command(subcommand)]
    Dns(crate::routes::DnsCommand),
    /// List subnet routes and exits with their routers, approve and deny them (docs/routes.md)
    #[command(subcommand)]
    Route(crate::routes::RouteCommand),
    /// List the audit log and verify that it is the one plexsphere wrote (docs/audit.md)
    #[command(subcommand)]
    Audit(crate::audit::AuditCommand),
    /// Create, show, list and delete resources the broker provisions
    #[command(subcommand)]
    Resource(ResourceCommand),
    /// Create, list and revoke the cloud credentials resources are provisioned with
    #[command(subcommand)]
    CloudCredential(CredentialCommand),
    /// List the blueprint catalog
    #[command(subcommand)]
    Blueprint(ListCommand),
    /// Print plexctl's version and the server's
    Version,
    /// Show the operator token in use: its scope, project, expiry and last use
    Whoami,
    /// List, create and revoke operator tokens (needs an admin token)
    #[command(subcommand)]
    OperatorToken(OperatorTokenCommand),
    /// Sign in through the server's OpenID issuer and keep a short-lived session (docs/auth.md)
    Login {
        /// Use the loopback redirect even when the issuer offers the device authorization grant
        #[arg(long)]
        no_device: bool,
    },
    /// End the session `plexctl login` kept (revoked at the server) and delete it
    Logout,
    /// Bind, unbind and list roles of people (subjects, e-mail addresses, groups)
    #[command(subcommand)]
    Role(crate::roles::RoleCommand),
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue a bootstrap token; its text is shown this once
    Issue {
        /// The project's id or slug
        #[arg(long, value_name = "PROJECT")]
        project: String,
        /// The token's kind
        #[arg(long, default_value = "node", value_name = "KIND")]
        kind: String,
        /// 1-16 characters of a-z0-9, shown in the token's text (pxbt_<env>_...)
        #[arg(long, value_name = "ENV")]
        env_prefix: String,
        /// How long the token can be used: 90s, 30m, 1h, 2d, 1h30m (the server allows 60s to 30d)
        #[arg(long, default_value = "1h", value_name = "DURATION")]
        ttl: String,
        /// How many nodes may register with it, 1-1000 (an autoscaling group's size)
        #[arg(long, default_value_t = 1, value_name = "N")]
        uses: u32,
        /// Make its nodes ephemeral: the control plane removes one once it stays offline for
        /// --ephemeral-offline
        #[arg(long)]
        ephemeral: bool,
        /// How long an ephemeral node may stay offline before it is removed: 2m to 7d
        #[arg(
            long,
            default_value = "30m",
            value_name = "DURATION",
            requires = "ephemeral"
        )]
        ephemeral_offline: String,
        /// A tag every node the token registers gets (`web` or `tag:web`; repeat for more, at
        /// most 32). Needs a token not limited to a project: whoever holds the bootstrap token
        /// enrols machines with what the policy grants these tags
        #[arg(long = "tag", value_name = "TAG")]
        tags: Vec<String>,
    },
    /// List a project's bootstrap tokens: status, uses of the limit, ephemeral, the nodes made
    List {
        /// The project's id or slug
        #[arg(long, value_name = "PROJECT")]
        project: String,
    },
    /// Revoke a bootstrap token so that no node can register with it
    Revoke {
        /// The token's id (the ID column of `bootstrap-token list`)
        #[arg(
            value_name = "ID",
            conflicts_with = "id_flag",
            required_unless_present = "id_flag"
        )]
        id: Option<String>,
        /// The token's id, as a flag
        #[arg(long = "id", value_name = "ID")]
        id_flag: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List nodes, optionally of one project
    List {
        /// The project's id or slug
        #[arg(long, value_name = "PROJECT")]
        project: Option<String>,
    },
    /// Show one node
    Get {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
    },
    /// Show what a node reported: handshakes, traffic and errors, newest first, and how many
    /// observations it dropped before sending (the server keeps the newest 500 per node)
    Observations {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
        /// How many to show, 1-500 (the server's default: 50)
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: Option<u32>,
        /// Only observations of this kind
        #[arg(long, value_name = "KIND", value_parser = ["handshake", "traffic", "error"])]
        kind: Option<String>,
    },
    /// Revoke a node: its credential stops working, its peers drop it, it leaves the mesh
    Revoke {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
        /// Do not ask for confirmation (needed when stdin is not a terminal)
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Ask a node to rotate its WireGuard key: it does so at its next heartbeat (the private
    /// key never leaves the node); `node get` shows key_rotated_at when it is done
    RotateKey {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
    },
    /// Ask a node to rotate its credential at its next heartbeat
    RotateCredential {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
    },
    /// Add tags to a node (`web` or `tag:web`); access policy rules select nodes by tag, and
    /// every node of the Domain applies the change at once
    Tag {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
        /// The tags to add
        #[arg(value_name = "TAG", required = true)]
        tags: Vec<String>,
    },
    /// Remove tags from a node (or all of them with --all)
    Untag {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
        /// The tags to remove
        #[arg(
            value_name = "TAG",
            required_unless_present = "all",
            conflicts_with = "all"
        )]
        tags: Vec<String>,
        /// Remove every tag of the node
        #[arg(long)]
        all: bool,
    },
    /// Rename a node: its DNS name in the Domain (`<name>.<suffix>`), a DNS label of a-z,
    /// 0-9 and '-' unique among the Domain's live nodes; every node applies it at once
    Rename {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
        /// The new name
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Change a node's settings that its signed state carries; the node applies them at once
    Set {
        /// The node's id or name (the NAME column of `node list`)
        #[arg(value_name = "NODE")]
        id: String,
        /// UDP segmentation offload (GSO/GRO) of the node's WireGuard socket: `off` where a
        /// kernel's GSO corrupts or loses datagrams, `on`, or `default` (the node's own choice)
        #[arg(long, value_name = "on|off|default", value_parser = ["on", "off", "default"])]
        udp_offload: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum DomainCommand {
    /// List them all
    List,
    /// List a Domain's signing keys: every generation, which signs now (current), which a
    /// rotation announced (next), and the retired ones
    SigningKeys {
        /// The Domain's id or slug
        #[arg(value_name = "DOMAIN")]
        domain: String,
    },
    /// Rotate a Domain's signing key (needs an admin token): a new key is announced to every
    /// node at once and signs after the overlap; until then the current key signs
    RotateKey {
        /// The Domain's id or slug
        #[arg(value_name = "DOMAIN")]
        domain: String,
        /// How long nodes are told of the new key before it signs: 0s to 30d (90s, 30m, 24h,
        /// 2d, 1h30m); give relays both keys meanwhile (`plexsphere domain-key` prints them)
        #[arg(long, default_value = "24h", value_name = "DURATION")]
        overlap: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ListCommand {
    /// List them all
    List,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn revoke_takes_a_positional_id_or_the_flag() {
        let positional = Cli::try_parse_from(["plexctl", "bootstrap-token", "revoke", "abc"]);
        assert!(matches!(
            positional.map(|c| c.command),
            Ok(Command::BootstrapToken(TokenCommand::Revoke { id: Some(id), id_flag: None })) if id == "abc"
        ));
        let flag = Cli::try_parse_from(["plexctl", "bootstrap-token", "revoke", "--id", "abc"]);
        assert!(matches!(
            flag.map(|c| c.command),
            Ok(Command::BootstrapToken(TokenCommand::Revoke { id: None, id_flag: Some(id) })) if id == "abc"
        ));
        assert!(Cli::try_parse_from(["plexctl", "bootstrap-token", "revoke"]).is_err());
        assert!(
            Cli::try_parse_from(["plexctl", "bootstrap-token", "revoke", "a", "--id", "b"])
                .is_err()
        );
    }

    #[test]
    fn node_set_takes_a_udp_offload_of_on_off_or_default() {
        for v in ["on", "off", "default"] {
            let cli = Cli::try_parse_from(["plexctl", "node", "set", "abc", "--udp-offload", v]);
            assert!(
                matches!(
                    cli.map(|c| c.command),
                    Ok(Command::Node(NodeCommand::Set { id, udp_offload })) if id == "abc" && udp_offload == v
                ),
                "{v}"
            );
        }
        let bad = Cli::try_parse_from(["plexctl", "node", "set", "abc", "--udp-offload", "maybe"]);
        assert!(bad.is_err());
        assert!(Cli::try_parse_from(["plexctl", "node", "set", "abc"]).is_err());
    }

    #[test]
    fn node_revoke_takes_an_id_and_yes() {
        let cli = Cli::try_parse_from(["plexctl", "node", "revoke", "abc", "--yes"]);
        assert!(matches!(
            cli.map(|c| c.command),
            Ok(Command::Node(NodeCommand::Revoke { id, yes: true })) if id == "abc"
        ));
        let cli = Cli::try_parse_from(["plexctl", "node", "revoke", "abc"]);
        assert!(matches!(
            cli.map(|c| c.command),
            Ok(Command::Node(NodeCommand::Revoke { yes: false, .. }))
        ));
        assert!(Cli::try_parse_from(["plexctl", "node", "revoke"]).is_err());
    }

    #[test]
    fn node_observations_checks_limit_and_kind() {
        let cli = Cli::try_parse_from([
            "plexctl",
            "node",
            "observations",
            "abc",
            "--limit",
            "500",
            "--kind",
            "handshake",
        ]);
        assert!(matches!(
            cli.map(|c| c.command),
            Ok(Command::Node(NodeCommand::Observations { id, limit: Some(500), kind: Some(k) }))
                if id == "abc" && k == "handshake"
        ));
        let cli = Cli::try_parse_from(["plexctl", "node", "observations", "abc"]);
        assert!(matches!(
            cli.map(|c| c.command),
            Ok(Command::Node(NodeCommand::Observations {
                limit: None,
                kind: None,
                ..
            }))
        ));
        for bad in [
            &["--limit", "0"][..],
            &["--limit", "501"],
            &["--kind", "peer"],
            &["--limit", "x"],
        ] {
            let mut args = vec!["plexctl", "node", "observations", "abc"];
            args.extend_from_slice(bad);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "plexctl",
            "node",
            "list",
            "--server",
            "https://x",
            "--output",
            "json",
        ]);
        let Ok(cli) = cli else { panic!("parse failed") };
        assert_eq!(cli.global.server.as_deref(), Some("https://x"));
        assert_eq!(cli.global.output, Format::Json);
    }
}
