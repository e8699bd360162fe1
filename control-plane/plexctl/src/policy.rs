//! `plexctl policy ...`: a Domain's access policy (docs/policy.md). Tags: `tags.rs`.
//!
//! `policy set` and `policy rollback` never change anything without `--yes`: they validate on
//! the server and print the reachability diff, then say how to apply it. The version they
//! read is sent along, so a change someone else made meanwhile is refused (409), not
//! overwritten. `policy test FILE` runs offline (the same parser and test runner as the
//! server, names unchecked) with `--offline` or when no server is configured.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use plexsphere_wire::admin::{DomainView, List};
use plexsphere_wire::policy_admin::{
    PolicyChange, PolicyExplanation, PolicyProblem, PolicyValidation, PolicyVersionView,
    PolicyView, RollbackPolicyRequest, SetPolicyRequest, ValidatePolicyRequest,
};

use crate::client::Api;
use crate::config::Settings;
use crate::failure::Failure;
use crate::names::node_id;
use crate::output::{Format, render};
use crate::policy_output as out;
use crate::session::operator_api;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the document in force (`-o json`: with its version, author and time)
    Get {
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
    },
    /// Check a document: syntax, limits and its own tests; against the Domain's projects,
    /// nodes and tags too when a server is configured (else, or with --offline, alone).
    /// Problems are printed as FILE:LINE:COLUMN: message; the exit code is 1 when there are any
    Test {
        /// The document (YAML)
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
        /// Check without a server: names of projects, nodes and tags are not checked
        #[arg(long)]
        offline: bool,
    },
    /// Validate a document on the server and print the reachability diff (which node pairs
    /// gain or lose which ports); apply it only with --yes (needs an admin token)
    Set {
        /// The document (YAML)
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
        /// Only print the diff (the default without --yes)
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
        /// Apply the document
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Why SRC may (or may not) reach DST: the rule and line, or a rule that would allow it
    Explain {
        /// The source node's id or name
        #[arg(value_name = "SRC")]
        src: String,
        /// The destination node's id or name
        #[arg(value_name = "DST")]
        dst: String,
        /// What SRC opens on DST: 5432/tcp, 53/udp or icmp (left out: everything it may)
        #[arg(value_name = "PORT/PROTO")]
        what: Option<String>,
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
    },
    /// List the versions of the policy, newest first: who stored each, when, and its diff
    History {
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
        /// How many versions, 1-100 (the server's default: 20)
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
        limit: Option<u32>,
    },
    /// Store an earlier version's document again, as a new version: prints the diff, applies
    /// only with --yes (needs an admin token)
    Rollback {
        /// The version to return to (`policy history` lists them)
        #[arg(value_name = "VERSION")]
        version: u64,
        /// The Domain's id or slug (may be left out when the token sees one Domain)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
        /// Apply it
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

pub async fn run(
    cmd: &PolicyCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    match cmd {
        PolicyCommand::Get { domain } => {
            let api = &operator_api(settings)?;
            let domain = domain_of(api, domain.as_deref()).await?;
            let view: PolicyView = api.get(&["v1", "domains", &domain, "policy"], &[]).await?;
            render(format, &view, |v| v.document.clone())
        }
        PolicyCommand::Test {
            file,
            domain,
            offline,
        } => {
            let text = read(file)?;
            let name = file.display().to_string();
            if *offline || settings.server.is_none() {
                return test_offline(&name, &text);
            }
            let api = &operator_api(settings)?;
            let domain = domain_of(api, domain.as_deref()).await?;
            validate(api, &domain, &name, &text).await?;
            Ok(format!(
                "{name}: ok: valid for Domain {domain} (names checked, its tests pass)\n"
            ))
        }
        PolicyCommand::Set {
            file,
            domain,
            dry_run,
            yes,
        } => {
            let text = read(file)?;
            let api = &operator_api(settings)?;
            let domain = domain_of(api, domain.as_deref()).await?;
            let now: PolicyView = api.get(&["v1", "domains", &domain, "policy"], &[]).await?;
            validate(api, &domain, &file.display().to_string(), &text).await?;
            let body = SetPolicyRequest {
                document: text,
                expected_version: now.version,
                dry_run: !yes,
            };
            let change: PolicyChange = api
                .put(&["v1", "domains", &domain, "policy"], &body)
                .await?;
            let hint = (!yes && !dry_run).then_some("re-run with --yes to apply it");
            render(format, &change, |c| out::change(c, hint))
        }
        PolicyCommand::Explain {
            src,
            dst,
            what,
            domain,
        } => {
            let api = &operator_api(settings)?;
            let domain = domain_of(api, domain.as_deref()).await?;
            let (src, dst) = (node_id(api, src).await?, node_id(api, dst).await?);
            let (src, dst) = (src.to_string(), dst.to_string());
            let mut query = vec![("src", src.as_str()), ("dst", dst.as_str())];
            if let Some(w) = what {
                query.push(("what", w.as_str()));
            }
            let e: PolicyExplanation = api
                .get(&["v1", "domains", &domain, "policy", "explain"], &query)
                .await?;
            render(format, &e, out::explanation)
        }
        PolicyCommand::History { domain, limit } => {
            let api = &operator_api(settings)?;
            let domain = domain_of(api, domain.as_deref()).await?;
            let limit = limit.map(|n| n.to_string());
            let query: Vec<(&str, &str)> = limit.iter().map(|n| ("limit", n.as_str())).collect();
            let list: List<PolicyVersionView> = api
                .get(&["v1", "domains", &domain, "policy", "history"], &query)
                .await?;
            render(format, list.items.as_slice(), out::history)
        }
        PolicyCommand::Rollback {
            version,
            domain,
            yes,
        } => {
            let api = &operator_api(settings)?;
            let domain = domain_of(api, domain.as_deref()).await?;
            let now: PolicyView = api.get(&["v1", "domains", &domain, "policy"], &[]).await?;
            let body = RollbackPolicyRequest {
                version: *version,
                expected_version: now.version,
                dry_run: !yes,
            };
            let change: PolicyChange = api
                .post(
                    &["v1", "domains", &domain, "policy", "rollback"],
                    Some(&body),
                )
                .await?;
            let hint = (!yes).then_some("re-run with --yes to apply it");
            render(format, &change, |c| out::change(c, hint))
        }
    }
}

fn read(file: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(file)
        .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", file.display())))
}

/// The Domain given, or the only one the token sees.
pub(crate) async fn domain_of(api: &Api, given: Option<&str>) -> Result<String, Failure> {
    if let Some(d) = given {
        return Ok(d.trim().to_owned());
    }
    let list: List<DomainView> = api.get(&["v1", "domains"], &[]).await?;
    match list.items.as_slice() {
        [one] => Ok(one.slug.clone()),
        [] => Err(Failure::NotFound(
            "this token sees no Domain; check `plexctl whoami`".into(),
        )),
        many => Err(Failure::Usage(format!(
            "this token sees {} Domains; give --domain (one of: {})",
            many.len(),
            many.iter()
                .map(|d| d.slug.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Problems as compilers print them, after a line saying how many.
fn problems(file: &str, errors: &[PolicyProblem]) -> Failure {
    let lines: Vec<String> = errors.iter().map(|e| e.render(file)).collect();
    Failure::PolicyInvalid(format!(
        "{file}: {} problem{}; nothing was changed\n{}",
        errors.len(),
        if errors.len() == 1 { "" } else { "s" },
        lines.join("\n")
    ))
}

/// Validates on the server; problems become a failure naming `file`.
async fn validate(api: &Api, domain: &str, file: &str, text: &str) -> Result<(), Failure> {
    let body = ValidatePolicyRequest {
        document: text.to_owned(),
    };
    let v: PolicyValidation = api
        .post(
            &["v1", "domains", domain, "policy", "validate"],
            Some(&body),
        )
        .await?;
    if v.valid {
        Ok(())
    } else {
        Err(problems(file, &v.errors))
    }
}

/// Parse, limits and the document's own tests, without a Domain (pure): a test about a tag
/// or project no node carries uses a stand-in node (docs/policy.md).
pub fn test_offline(file: &str, text: &str) -> Result<String, Failure> {
    let checked = plexsphere_policy::parse(text).and_then(|p| {
        plexsphere_policy::run_tests(&p, &plexsphere_policy::inventory::Inventory::default())
            .map(|()| p)
    });
    match checked {
        Ok(p) => Ok(format!(
            "{file}: ok: {} rule{}, {} test{} passed (offline: project, node and tag names are not checked against a Domain)\n",
            p.rules.len(),
            if p.rules.len() == 1 { "" } else { "s" },
            p.tests.len(),
            if p.tests.len() == 1 { "" } else { "s" },
        )),
        Err(errs) => {
            let list: Vec<PolicyProblem> = errs
                .0
                .iter()
                .map(|e| PolicyProblem {
                    kind: String::new(),
                    line: e.location.line,
                    column: e.location.column,
                    message: e.message.clone(),
                })
                .collect();
            Err(problems(file, &list))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_test_reports_file_line_column() {
        let ok = test_offline("p.yaml", plexsphere_policy::DEFAULT_DOCUMENT).unwrap();
        assert!(ok.starts_with("p.yaml: ok: 1 rule, 0 tests passed"), "{ok}");
        let bad = "rules:\n  - {src: 'tag:web', dst: tag:db, proto: tcp, ports: 99999}\n";
        let e = test_offline("p.yaml", bad).unwrap_err();
        assert_eq!(e.exit_code(), 1);
        let text = e.to_string();
        assert!(
            text.starts_with("p.yaml: 1 problem; nothing was changed\np.yaml:2:"),
            "{text}"
        );
        let failing = "rules: []\ntests:\n  - {src: tag:web, dst: tag:db, port: 5432, proto: tcp, expect: accept}\n";
        let text = test_offline("f.yaml", failing).unwrap_err().to_string();
        assert!(text.contains("\nf.yaml:3:"), "{text}");
    }
}
