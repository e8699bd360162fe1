//! The seed manifest's shape and the checks that need no database: slugs, canonical CIDRs,
//! sub-ranges inside their Domain's range and apart. A refusal is a [`ManifestError`], one
//! variant per rule.

use ipnet::IpNet;
use serde::Deserialize;
use uuid::Uuid;

use crate::ipam::{contains_net, overlaps};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub domains: Vec<DomainSeed>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainSeed {
    pub slug: String,
    #[serde(default)]
    pub id: Option<Uuid>,
    pub mesh_cidr: IpNet,
    #[serde(default)]
    pub projects: Vec<ProjectSeed>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectSeed {
    pub slug: String,
    #[serde(default)]
    pub id: Option<Uuid>,
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub sub_range_cidr: Option<IpNet>,
}

/// Why a manifest is not valid, found without a database: each rule its own variant (a test
/// or a caller tells them apart without reading the text), each line says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("domain slug {0:?} must be 1-63 characters of a-z, 0-9 and '-'")]
    DomainSlug(String),
    #[error("domain {0:?} is declared twice")]
    DomainTwice(String),
    #[error("domain {slug:?}: mesh_cidr {cidr} has host bits set; write {}", cidr.trunc())]
    MeshHostBits { slug: String, cidr: IpNet },
    #[error("project slug {0:?} must be 1-63 characters of a-z, 0-9 and '-'")]
    ProjectSlug(String),
    #[error("project {project:?} is declared twice in domain {domain:?}")]
    ProjectTwice { project: String, domain: String },
    #[error("project {project:?}: sub_range_cidr {sub} has host bits set; write {}", sub.trunc())]
    SubRangeHostBits { project: String, sub: IpNet },
    #[error(
        "project {project:?}: sub_range_cidr {sub} is not inside the domain's mesh_cidr {mesh}"
    )]
    SubRangeOutside {
        project: String,
        sub: IpNet,
        mesh: IpNet,
    },
    #[error(
        "project {project:?}: sub_range_cidr {sub} overlaps project {other_project:?}'s {other}"
    )]
    SubRangesOverlap {
        project: String,
        sub: IpNet,
        other_project: String,
        other: IpNet,
    },
}

fn valid_slug(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The checks that need no database: slugs, canonical CIDRs, sub-ranges inside and apart.
pub(super) fn check(m: &Manifest) -> Result<(), ManifestError> {
    let mut slugs = std::collections::HashSet::new();
    for d in &m.domains {
        if !valid_slug(&d.slug) {
            return Err(ManifestError::DomainSlug(d.slug.clone()));
        }
        if !slugs.insert(d.slug.clone()) {
            return Err(ManifestError::DomainTwice(d.slug.clone()));
        }
        if d.mesh_cidr != d.mesh_cidr.trunc() {
            return Err(ManifestError::MeshHostBits {
                slug: d.slug.clone(),
                cidr: d.mesh_cidr,
            });
        }
        let mut project_slugs = std::collections::HashSet::new();
        for (i, p) in d.projects.iter().enumerate() {
            if !valid_slug(&p.slug) {
                return Err(ManifestError::ProjectSlug(p.slug.clone()));
            }
            if !project_slugs.insert(p.slug.clone()) {
                return Err(ManifestError::ProjectTwice {
                    project: p.slug.clone(),
                    domain: d.slug.clone(),
                });
            }
            let Some(sub) = p.sub_range_cidr else {
                continue;
            };
            if sub != sub.trunc() {
                return Err(ManifestError::SubRangeHostBits {
                    project: p.slug.clone(),
                    sub,
                });
            }
            if !contains_net(&d.mesh_cidr, &sub) {
                return Err(ManifestError::SubRangeOutside {
                    project: p.slug.clone(),
                    sub,
                    mesh: d.mesh_cidr,
                });
            }
            for q in &d.projects[..i] {
                if let Some(other) = q.sub_range_cidr
                    && overlaps(&sub, &other)
                {
                    return Err(ManifestError::SubRangesOverlap {
                        project: p.slug.clone(),
                        sub,
                        other_project: q.slug.clone(),
                        other,
                    });
                }
            }
        }
    }
    Ok(())
}
