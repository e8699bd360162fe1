//! The seed manifest: YAML that declares Domains and their Projects.
//!
//! Applying a manifest is idempotent and all-or-nothing: it runs in one transaction, creates
//! what is missing, updates display names (and the sub-range of a Project without nodes), and
//! refuses, changing nothing, when it would move an existing Domain's mesh range, re-home a
//! pinned Project id, or move the sub-range of a Project that has nodes.

use std::path::Path;

use ipnet::IpNet;
use uuid::Uuid;

use crate::ipam::overlaps;
use crate::store::domains::{self, Domain};
use crate::store::projects::{self, Project};
use crate::store::{self, Store, StoreError, nodes};

mod manifest;

pub use manifest::{DomainSeed, Manifest, ManifestError, ProjectSeed};

/// The lab seed `plexsphere dev` applies when given no other.
pub const LAB_SEED: &str = include_str!("../../seeds/lab.yaml");

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("cannot read the seed manifest {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the seed manifest {origin} is not valid: {message}")]
    Parse { origin: String, message: String },
    #[error("the seed manifest {origin} is not valid: {problem}; nothing was applied")]
    Invalid {
        origin: String,
        problem: ManifestError,
    },
    #[error("the seed manifest {origin} was refused: {message}; nothing was applied")]
    Refused { origin: String, message: String },
    #[error("applying the seed manifest {origin} failed: {source}; nothing was applied")]
    Store { origin: String, source: StoreError },
}

/// What applying a manifest did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SeedReport {
    pub domains_created: Vec<String>,
    pub projects_created: Vec<String>,
    pub projects_updated: Vec<String>,
    /// Every Domain and Project of the manifest with its id, for printing.
    pub ids: Vec<(String, Uuid)>,
}

impl SeedReport {
    pub fn changed(&self) -> bool {
        !(self.domains_created.is_empty()
            && self.projects_created.is_empty()
            && self.projects_updated.is_empty())
    }
}

/// Parses and checks a manifest without touching any database. `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Manifest, SeedError> {
    let manifest: Manifest = serde_yaml::from_str(text).map_err(|e| SeedError::Parse {
        origin: origin.to_owned(),
        message: e.to_string(),
    })?;
    manifest::check(&manifest).map_err(|problem| SeedError::Invalid {
        origin: origin.to_owned(),
        problem,
    })?;
    Ok(manifest)
}

pub(crate) fn load(path: &Path) -> Result<Manifest, SeedError> {
    let text = std::fs::read_to_string(path).map_err(|source| SeedError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Applies a checked manifest in one transaction (retried whole if it loses a race).
pub async fn apply(
    store: &Store,
    m: &Manifest,
    origin: &str,
    now: time::OffsetDateTime,
) -> Result<SeedReport, SeedError> {
    let now = store::unix(now);
    let result = store::retry("seed apply", |e: &ApplyError| matches!(e, ApplyError::Store(s) if s.is_busy() || s.is_unique_violation()), || {
        apply_once(store, m, now)
    })
    .await;
    result.map_err(|e| match e {
        ApplyError::Refused(message) => SeedError::Refused {
            origin: origin.to_owned(),
            message,
        },
        ApplyError::Store(source) => SeedError::Store {
            origin: origin.to_owned(),
            source,
        },
    })
}

enum ApplyError {
    Refused(String),
    Store(StoreError),
}

impl From<StoreError> for ApplyError {
    fn from(e: StoreError) -> Self {
        ApplyError::Store(e)
    }
}

impl From<sqlx::Error> for ApplyError {
    fn from(e: sqlx::Error) -> Self {
        ApplyError::Store(e.into())
    }
}

async fn apply_once(store: &Store, m: &Manifest, now: i64) -> Result<SeedReport, ApplyError> {
    let mut report = SeedReport::default();
    let mut tx = store.begin().await?;
    for d in &m.domains {
        let domain = match domains::by_slug(&mut tx, &d.slug).await? {
            Some(existing) => {
                if existing.mesh_cidr != d.mesh_cidr {
                    return Err(ApplyError::Refused(format!(
                        "domain {:?} already has mesh_cidr {}; changing it to {} would move every node's address (a changed mesh CIDR is never applied)",
                        d.slug, existing.mesh_cidr, d.mesh_cidr
                    )));
                }
                if d.id.is_some_and(|id| id != existing.id) {
                    return Err(ApplyError::Refused(format!(
                        "domain {:?} already exists with id {}",
                        d.slug, existing.id
                    )));
                }
                existing
            }
            None => {
                let domain = Domain {
                    id: d.id.unwrap_or_else(Uuid::now_v7),
                    slug: d.slug.clone(),
                    mesh_cidr: d.mesh_cidr,
                    created_at: now,
                };
                domains::insert(&mut tx, &domain).await?;
                // Every Domain starts with the explicit allow-all policy as version 1.
                crate::store::policies::insert_default(&mut tx, domain.id, now).await?;
                report.domains_created.push(d.slug.clone());
                domain
            }
        };
        report.ids.push((format!("domain {}", d.slug), domain.id));
        for p in &d.projects {
            let id = apply_project(&mut tx, &domain, p, now, &mut report).await?;
            report.ids.push((format!("project {}", p.slug), id));
        }
        // Sub-ranges must stay apart from every Project of the Domain, not only the manifest's.
        let all = projects::in_domain(&mut tx, domain.id).await?;
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                if let (Some(x), Some(y)) = (a.sub_range_cidr, b.sub_range_cidr)
                    && overlaps(&x, &y)
                {
                    return Err(ApplyError::Refused(format!(
                        "project {:?}'s sub_range_cidr {x} overlaps project {:?}'s {y}",
                        a.slug, b.slug
                    )));
                }
            }
        }
    }
    tx.commit().await?;
    Ok(report)
}

async fn apply_project(
    tx: &mut sqlx::AnyConnection,
    domain: &Domain,
    p: &ProjectSeed,
    now: i64,
    report: &mut SeedReport,
) -> Result<Uuid, ApplyError> {
    let in_domain = projects::in_domain(tx, domain.id).await?;
    let by_slug = in_domain.iter().find(|x| x.slug == p.slug).cloned();
    let existing = match p.id {
        Some(id) => {
            let found = projects::get(tx, id).await?;
            if let Some(f) = &found
                && (f.domain_id != domain.id || f.slug != p.slug)
            {
                return Err(ApplyError::Refused(format!(
                    "project id {id} already exists as {:?} in another place; pinned ids cannot move",
                    f.slug
                )));
            }
            if found.is_none()
                && let Some(other) = &by_slug
            {
                return Err(ApplyError::Refused(format!(
                    "project {:?} already exists with id {}, not the pinned {id}",
                    p.slug, other.id
                )));
            }
            found
        }
        None => by_slug,
    };
    let Some(mut project) = existing else {
        let project = Project {
            id: p.id.unwrap_or_else(Uuid::now_v7),
            domain_id: domain.id,
            slug: p.slug.clone(),
            display_name: p.display_name.clone(),
            sub_range_cidr: p.sub_range_cidr,
            created_at: now,
        };
        projects::insert(tx, &project).await?;
        report.projects_created.push(p.slug.clone());
        return Ok(project.id);
    };
    if project.display_name == p.display_name && project.sub_range_cidr == p.sub_range_cidr {
        return Ok(project.id);
    }
    if project.sub_range_cidr != p.sub_range_cidr
        && nodes::count_live_in_project(tx, project.id).await? > 0
    {
        return Err(ApplyError::Refused(format!(
            "project {:?} has nodes, so its sub_range_cidr cannot change from {} to {}",
            p.slug,
            show(project.sub_range_cidr),
            show(p.sub_range_cidr)
        )));
    }
    project.display_name = p.display_name.clone();
    project.sub_range_cidr = p.sub_range_cidr;
    projects::update(tx, &project).await?;
    report.projects_updated.push(p.slug.clone());
    Ok(project.id)
}

fn show(c: Option<IpNet>) -> String {
    c.map_or_else(|| "none".to_owned(), |c| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_seed_parses() {
        let m = parse(LAB_SEED, "lab.yaml").unwrap();
        assert_eq!(m.domains[0].slug, "lab");
        assert_eq!(m.domains[0].projects.len(), 2);
    }

    #[test]
    fn refusals_name_the_problem() {
        let err = |text: &str| parse(text, "t.yaml").unwrap_err().to_string();
        let e = err("domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/16\n    colour: red\n");
        assert!(
            e.contains("unknown field `colour`") && e.contains("line 4"),
            "{e}"
        );
        let e = err("domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/99\n");
        assert!(e.contains("line 3"), "{e}");
        let e = err(
            "domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/16\n    projects:\n      - slug: a\n        sub_range_cidr: 10.65.0.0/24\n",
        );
        assert!(e.contains("not inside"), "{e}");
        let e = err(
            "domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/16\n    projects:\n      - slug: a\n        sub_range_cidr: 10.64.0.0/23\n      - slug: b\n        sub_range_cidr: 10.64.1.0/24\n",
        );
        assert!(e.contains("overlaps"), "{e}");
        let e = err("domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.1/16\n");
        assert!(e.contains("host bits"), "{e}");
    }

    /// Each rule of `check` is its own variant, and its line reads as it did when the check
    /// returned a String (pinned byte for byte, through `SeedError`'s line).
    #[test]
    fn each_refusal_is_its_own_kind_with_its_line() {
        let domain =
            |rest: &str| format!("domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.0/16\n{rest}");
        let projects = |list: &str| domain(&format!("    projects:\n{list}"));
        let cases: Vec<(String, ManifestError, &str)> = vec![
            (
                "domains:\n  - slug: Lab\n    mesh_cidr: 10.64.0.0/16\n".to_owned(),
                ManifestError::DomainSlug("Lab".into()),
                "domain slug \"Lab\" must be 1-63 characters of a-z, 0-9 and '-'",
            ),
            (
                domain("  - slug: lab\n    mesh_cidr: 10.65.0.0/16\n"),
                ManifestError::DomainTwice("lab".into()),
                "domain \"lab\" is declared twice",
            ),
            (
                "domains:\n  - slug: lab\n    mesh_cidr: 10.64.0.1/16\n".to_owned(),
                ManifestError::MeshHostBits {
                    slug: "lab".into(),
                    cidr: "10.64.0.1/16".parse().unwrap(),
                },
                "domain \"lab\": mesh_cidr 10.64.0.1/16 has host bits set; write 10.64.0.0/16",
            ),
            (
                projects("      - slug: a_b\n"),
                ManifestError::ProjectSlug("a_b".into()),
                "project slug \"a_b\" must be 1-63 characters of a-z, 0-9 and '-'",
            ),
            (
                projects("      - slug: a\n      - slug: a\n"),
                ManifestError::ProjectTwice {
                    project: "a".into(),
                    domain: "lab".into(),
                },
                "project \"a\" is declared twice in domain \"lab\"",
            ),
            (
                projects("      - slug: a\n        sub_range_cidr: 10.64.1.1/24\n"),
                ManifestError::SubRangeHostBits {
                    project: "a".into(),
                    sub: "10.64.1.1/24".parse().unwrap(),
                },
                "project \"a\": sub_range_cidr 10.64.1.1/24 has host bits set; write 10.64.1.0/24",
            ),
            (
                projects("      - slug: a\n        sub_range_cidr: 10.65.0.0/24\n"),
                ManifestError::SubRangeOutside {
                    project: "a".into(),
                    sub: "10.65.0.0/24".parse().unwrap(),
                    mesh: "10.64.0.0/16".parse().unwrap(),
                },
                "project \"a\": sub_range_cidr 10.65.0.0/24 is not inside the domain's mesh_cidr 10.64.0.0/16",
            ),
            (
                projects(
                    "      - slug: a\n        sub_range_cidr: 10.64.0.0/23\n      - slug: b\n        sub_range_cidr: 10.64.1.0/24\n",
                ),
                ManifestError::SubRangesOverlap {
                    project: "b".into(),
                    sub: "10.64.1.0/24".parse().unwrap(),
                    other_project: "a".into(),
                    other: "10.64.0.0/23".parse().unwrap(),
                },
                "project \"b\": sub_range_cidr 10.64.1.0/24 overlaps project \"a\"'s 10.64.0.0/23",
            ),
        ];
        for (text, want, line) in cases {
            let e = parse(&text, "t.yaml").unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("the seed manifest t.yaml is not valid: {line}; nothing was applied")
            );
            assert!(
                matches!(&e, SeedError::Invalid { problem, .. } if *problem == want),
                "{text}: {e:?}"
            );
        }
    }
}
