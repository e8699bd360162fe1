//! The broker's subcommands: resources, cloud credentials and the blueprint catalog.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum ResourceCommand {
    /// Declare a resource; the server accepts it (202) and provisions it asynchronously
    Create {
        /// The project's id or slug (optional when the operator token sees one project)
        #[arg(long, visible_alias = "project", value_name = "PROJECT")]
        project_id: Option<String>,
        /// The resource kind; must be the blueprint's (see `plexctl blueprint list`)
        #[arg(long, value_name = "KIND")]
        kind: String,
        /// The blueprint version (the VERSION ID column of `plexctl blueprint list`)
        #[arg(long, value_name = "ID")]
        blueprint_version_id: String,
        /// The cloud credential (the ID column of `plexctl cloud-credential list`)
        #[arg(long, value_name = "ID")]
        cloud_credential_id: String,
        /// The blueprint's parameters as a JSON object, e.g. '{"region":"us-east-1"}'
        #[arg(long, value_name = "JSON", default_value = "{}")]
        parameters: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Show one resource (also once Deleted)
    Get {
        /// The resource's id
        #[arg(value_name = "ID")]
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// List a project's resources
    List {
        /// The project's id or slug (optional when the operator token sees one project)
        #[arg(long, visible_alias = "project", value_name = "PROJECT")]
        project_id: Option<String>,
    },
    /// Deprovision a resource; Deleted once the substrate confirms it is gone
    Delete {
        /// The resource's id
        #[arg(value_name = "ID")]
        id: String,
        /// Do not ask for confirmation (needed when stdin is not a terminal)
        #[arg(long, short = 'y')]
        yes: bool,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

/// `--wait`: follow the resource's phases until it settles.
#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Poll the resource and print each phase change until it is Ready (Deleted for delete)
    /// or Failed; exit 1 on Failed, 2 on --timeout
    #[arg(long)]
    pub wait: bool,
    /// How often --wait polls: 1s, 5s, 1m
    #[arg(long, default_value = "1s", value_name = "DURATION", requires = "wait")]
    pub poll_interval: String,
    /// How long --wait waits at most: 90s, 15m, 1h
    #[arg(
        long,
        default_value = "15m",
        value_name = "DURATION",
        requires = "wait"
    )]
    pub timeout: String,
}

/// Where a credential's payload comes from: one of the three.
#[derive(Debug, clap::Args)]
pub struct PayloadArgs {
    /// The payload as a JSON object (it shows in `ps`; prefer --payload-file)
    #[arg(long, value_name = "JSON", conflicts_with_all = ["payload_file", "clouds_yaml"])]
    pub payload: Option<String>,
    /// A file holding the payload as a JSON object
    #[arg(long, value_name = "PATH", conflicts_with = "clouds_yaml")]
    pub payload_file: Option<PathBuf>,
    /// An OpenStack clouds.yaml to take the payload from (with --cloud): auth, region_name,
    /// interface and cacert of that cloud
    #[arg(long, value_name = "PATH", requires = "cloud")]
    pub clouds_yaml: Option<PathBuf>,
    /// The cloud of --clouds-yaml
    #[arg(long, value_name = "NAME", requires = "clouds_yaml")]
    pub cloud: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum CredentialCommand {
    /// Store a cloud credential; its payload is sealed on the server and never shown again
    Create {
        /// A name for people
        #[arg(long, value_name = "NAME")]
        name: String,
        /// The provider: local or openstack
        #[arg(long, value_name = "PROVIDER")]
        provider: String,
        #[command(flatten)]
        payload: PayloadArgs,
    },
    /// List the cloud credentials (never their payloads)
    List,
    /// Give a cloud credential a new payload (a rotated application credential); its resources
    /// use it from their next reconcile pass
    Rotate {
        /// The credential's id
        #[arg(value_name = "ID")]
        id: String,
        #[command(flatten)]
        payload: PayloadArgs,
    },
    /// Revoke a cloud credential so that no new resource can use it
    Revoke {
        /// The credential's id
        #[arg(value_name = "ID")]
        id: String,
    },
}
