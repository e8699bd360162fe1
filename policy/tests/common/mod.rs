//! Inventories for the tests: nodes by name, Project and tags, addresses from the name's
//! position.
#![allow(dead_code, clippy::unwrap_used)] // test helpers: a failure here is a test failure

use std::net::{Ipv4Addr, Ipv6Addr};

use plexsphere_policy::{Inventory, NodeInfo, ProjectInfo};
use uuid::Uuid;

pub fn project_id(slug: &str) -> Uuid {
    Uuid::from_u128(0x1000 + slug.bytes().map(u128::from).sum::<u128>())
}

/// `nodes`: (name, project slug, tags). Node i gets 10.64.0.(i+1) and fd00::(i+1).
pub fn inventory(nodes: &[(&str, &str, &[&str])]) -> Inventory {
    let mut projects: Vec<ProjectInfo> = Vec::new();
    let mut out = Vec::new();
    for (i, (name, project, tags)) in nodes.iter().enumerate() {
        if !projects.iter().any(|p| p.slug == *project) {
            projects.push(ProjectInfo {
                id: project_id(project),
                slug: project.to_string(),
            });
        }
        let n = u8::try_from(i + 1).unwrap();
        out.push(NodeInfo {
            id: Uuid::from_u128(i as u128 + 1),
            name: name.to_string(),
            project_id: project_id(project),
            project_slug: project.to_string(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ipv4: Some(Ipv4Addr::new(10, 64, 0, n)),
            ipv6: Some(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n))),
        });
    }
    Inventory {
        projects,
        nodes: out,
        tags: Vec::new(),
    }
}

/// web, db, ci in project shop (ci in project build), the matrix.
pub fn web_db_ci() -> Inventory {
    inventory(&[
        ("web", "shop", &["web", "prod"]),
        ("db", "shop", &["db", "prod"]),
        ("ci", "build", &["ci"]),
    ])
}

pub fn node<'a>(inv: &'a Inventory, name: &str) -> &'a NodeInfo {
    inv.find_node(name).unwrap()
}
