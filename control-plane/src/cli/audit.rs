//! The host's side of the audit log: `plexsphere audit-pepper generate`, the pepper flags of
//! the one-shot commands, and their audit rows (actor `host-cli`).

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use ring::hmac;
use time::OffsetDateTime;

use super::failure::Failure;
use crate::audit::{self, AuditEntry, Pepper, pepper};
use crate::keys::Kek;
use crate::store::{self, Store};

#[derive(Debug, Subcommand)]
pub enum AuditPepperCommand {
    /// Make an audit pepper and write it to a new file (mode 0600, never overwritten); give
    /// every replica the same one (`--audit-pepper-file`).
    Generate {
        #[arg(long)]
        out: PathBuf,
    },
}

pub(crate) fn audit_pepper(cmd: AuditPepperCommand) -> Result<(), Failure> {
    match cmd {
        AuditPepperCommand::Generate { out } => {
            pepper::generate(&out).map_err(|e| Failure::Config(e.to_string()))?;
            println!("audit pepper written to {}", out.display());
            Ok(())
        }
    }
}

/// How a one-shot command that changes something finds the audit pepper the server uses.
#[derive(Debug, Clone, Args)]
pub struct AuditKeyArgs {
    /// The audit pepper the server uses (`--audit-pepper-file` of `plexsphere serve`).
    #[arg(long, env = "PLEXSPHERE_AUDIT_PEPPER_FILE")]
    pub audit_pepper_file: Option<PathBuf>,
    /// The server's key-encryption key, when it has no pepper of its own (the pepper is then
    /// derived from the KEK).
    #[arg(long, env = "PLEXSPHERE_KEY_ENCRYPTION_KEY_FILE")]
    pub key_encryption_key_file: Option<PathBuf>,
}

/// The pepper a host command records under, as the server finds it: the pepper file or
/// credential, `plexsphere dev`'s in the data directory, else derived from the KEK (its file
/// or credential, `plexsphere dev`'s). `None` when there is none of these.
pub(crate) fn host_pepper(
    data_dir: &Path,
    args: &AuditKeyArgs,
) -> Result<Option<hmac::Key>, Failure> {
    let config = |e: String| Failure::Config(e);
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    let dev_pepper = data_dir.join(pepper::DEV_PEPPER_FILE);
    let found = match Pepper::locate(args.audit_pepper_file.as_deref(), creds.as_deref()) {
        Ok(Pepper::FromKek) if dev_pepper.exists() => Pepper::read(&dev_pepper),
        other => other,
    }
    .map_err(|e| config(e.to_string()))?;
    if let Pepper::File { key, .. } = found {
        return Ok(Some(key));
    }
    let dev_kek = data_dir.join(crate::keys::kek::DEV_KEK_FILE);
    let kek = match Kek::locate(args.key_encryption_key_file.as_deref(), creds.as_deref()) {
        Ok(k) => Some(k),
        Err(crate::keys::KekError::Missing) if dev_kek.exists() => {
            Some(Kek::read(&dev_kek).map_err(|e| config(e.to_string()))?)
        }
        Err(crate::keys::KekError::Missing) => None,
        Err(e) => return Err(config(e.to_string())),
    };
    Ok(kek.map(|k| k.derive_hmac_key(pepper::KEK_LABEL)))
}

/// Records a host command's change right after it (actor `host-cli`); without a pepper it
/// says on stderr that the change is not in the audit log and how to fix that.
pub(crate) async fn record_host(
    store: &Store,
    pepper: Option<&hmac::Key>,
    action: &'static str,
    target: String,
    detail: serde_json::Value,
) -> Result<(), Failure> {
    let Some(pepper) = pepper else {
        eprintln!(
            "warning: {action} {target} is not in the audit log: no audit pepper found; pass --audit-pepper-file (or --key-encryption-key-file) as `plexsphere serve` has it"
        );
        return Ok(());
    };
    let entry = AuditEntry {
        domain_id: None,
        actor: audit::Actor::host_cli(),
        action,
        target,
        detail,
    };
    let now = store::unix(OffsetDateTime::now_utc());
    let mut tx = store
        .begin()
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    audit::record(&mut tx, pepper, &entry, now)
        .await
        .map_err(|e| Failure::Runtime(anyhow::anyhow!("cannot write the audit row: {e}")))?;
    tx.commit()
        .await
        .map_err(|e| Failure::Runtime(anyhow::anyhow!("cannot write the audit row: {e}")))?;
    Ok(())
}

/// The pepper file `serve` uses: the flag, else the systemd credential, else derived from the
/// KEK.
pub(crate) fn serve_pepper(flag: Option<&Path>) -> Result<Pepper, Failure> {
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    let p = Pepper::locate(flag, creds.as_deref()).map_err(|e| Failure::Config(e.to_string()))?;
    tracing::info!(origin = %p.origin(), "audit pepper");
    Ok(p)
}
