//! `plexctl audit list|verify` (docs/audit.md): read a chain of the audit log, and have the
//! server walk it and name each row that is not the one it wrote.

use clap::Subcommand;
use plexsphere_wire::audit::{AuditPage, AuditRow, MAX_PAGE, VerifyReport, VerifyRequest};

use crate::config::Settings;
use crate::failure::Failure;
use crate::output::{Format, render, table, time};
use crate::session::operator_api;

/// The longest DETAIL cell of the table (the JSON output has it whole).
const DETAIL_CELL_CHARS: usize = 80;

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// List a chain's rows, oldest first: who (token or session, broker, host), how, what
    List {
        /// The Domain's id or slug; without it the platform chain (operator tokens, cloud
        /// credentials, platform role bindings)
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
        /// Only rows at or after this time (RFC 3339, e.g. 2026-12-06T05:00:00Z)
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only changes by the person with this e-mail (matched keyed, on the server)
        #[arg(long, value_name = "EMAIL")]
        actor_email: Option<String>,
        /// At most this many rows (paged from the server 1,000 at a time)
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Check that the chain is the one plexsphere wrote: names each removed, reordered,
    /// altered or inserted row by its seq; exits 1 when anything is wrong
    Verify {
        /// The Domain's id or slug; without it the platform chain
        #[arg(long, value_name = "DOMAIN")]
        domain: Option<String>,
    },
}

pub async fn run(
    cmd: &AuditCommand,
    format: Format,
    settings: &Settings,
) -> Result<String, Failure> {
    let api = &operator_api(settings)?;
    match cmd {
        AuditCommand::List {
            domain,
            since,
            actor_email,
            limit,
        } => {
            if *limit == 0 {
                return Err(Failure::Usage("--limit must be at least 1".into()));
            }
            let mut rows: Vec<AuditRow> = Vec::new();
            let mut after: Option<i64> = None;
            loop {
                let want = (*limit as usize - rows.len()).min(MAX_PAGE as usize);
                let want = want.to_string();
                let after_text = after.map(|a| a.to_string());
                let mut query: Vec<(&str, &str)> = vec![("limit", &want)];
                if let Some(d) = domain {
                    query.push(("domain", d));
                }
                if let Some(s) = since {
                    query.push(("since", s));
                }
                if let Some(e) = actor_email {
                    query.push(("actor_email", e));
                }
                if let Some(a) = &after_text {
                    query.push(("after", a));
                }
                let page: AuditPage = api.get(&["v1", "audit"], &query).await?;
                rows.extend(page.entries);
                match page.next_after {
                    Some(next) if rows.len() < *limit as usize => after = Some(next),
                    _ => break,
                }
            }
            render(format, rows.as_slice(), audit_table)
        }
        AuditCommand::Verify { domain } => {
            let body = VerifyRequest {
                domain: domain.clone(),
            };
            let report: VerifyReport = api.post(&["v1", "audit", "verify"], Some(&body)).await?;
            if report.ok {
                render(format, &report, |r| {
                    format!("audit chain {}: {} rows, all as written\n", r.chain, r.rows)
                })
            } else {
                Err(Failure::AuditTampered(problems(&report)))
            }
        }
    }
}

/// `value` on one line: control characters (a tampered row may hold any) escaped; `-` when
/// empty.
fn text(value: &str) -> String {
    if value.is_empty() {
        return "-".to_owned();
    }
    value
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The failure's text: a line saying how many, then one line per problem.
pub fn problems(r: &VerifyReport) -> String {
    let total = r.problems.len() as u64 + r.more_problems;
    let mut out = format!(
        "audit chain {} does not verify: {total} problem{} in {} rows",
        r.chain,
        if total == 1 { "" } else { "s" },
        r.rows
    );
    for p in &r.problems {
        out.push_str(&format!("\nseq {}: {}: {}", p.seq, p.kind, text(&p.detail)));
    }
    if r.more_problems > 0 {
        out.push_str(&format!("\n... and {} more", r.more_problems));
    }
    out
}

fn actor(r: &AuditRow) -> String {
    let a = &r.actor;
    let mut who = a.kind.clone();
    if !a.reference.is_empty() {
        who.push(':');
        who.push_str(&a.reference);
    }
    if !a.name.is_empty() {
        who.push_str(&format!(" ({})", a.name));
    }
    if let Some(k) = &a.email_key {
        who.push_str(&format!(" email#{}", &k[..k.len().min(12)]));
    }
    text(&who)
}

fn audit_table(rows: &[AuditRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut detail = r.detail.to_string();
            if detail.chars().count() > DETAIL_CELL_CHARS {
                detail = detail
                    .chars()
                    .take(DETAIL_CELL_CHARS - 3)
                    .collect::<String>()
                    + "...";
            }
            vec![
                r.seq.to_string(),
                time(r.at),
                actor(r),
                text(&r.actor.how),
                text(&r.action),
                text(&r.target),
                text(&detail),
            ]
        })
        .collect();
    table(
        &["SEQ", "AT", "ACTOR", "HOW", "ACTION", "TARGET", "DETAIL"],
        &cells,
    )
}

#[cfg(test)]
mod tests {
    use plexsphere_wire::audit::VerifyProblem;

    use super::*;

    #[test]
    fn each_problem_is_one_line_naming_its_seq() {
        let r = VerifyReport {
            ok: false,
            chain: "platform".into(),
            rows: 5,
            problems: vec![
                VerifyProblem {
                    seq: 3,
                    kind: "removed".into(),
                    detail: "seq 3 is missing".into(),
                },
                VerifyProblem {
                    seq: 4,
                    kind: "altered".into(),
                    detail: "evil\nline".into(),
                },
            ],
            more_problems: 0,
        };
        let text = problems(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].starts_with("seq 3: removed: "), "{text}");
        assert!(lines[2].starts_with("seq 4: altered: "), "{text}");
        assert!(lines[2].ends_with("evil\\nline"), "{text}");
    }
}
