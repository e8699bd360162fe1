//! The catalog: every blueprint version the server offers, the built-in ones plus the files the
//! operator points the server at, looked up by their stable version id.

use std::collections::BTreeMap;
use std::path::Path;

use uuid::Uuid;

use crate::blueprint::{Blueprint, BlueprintError};

/// The built-in blueprints, embedded at build time: (file label, YAML text).
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "builtin:local-machine.yaml",
        include_str!("../blueprints/local-machine.yaml"),
    ),
    (
        "builtin:local-bucket.yaml",
        include_str!("../blueprints/local-bucket.yaml"),
    ),
    (
        "builtin:openstack-instance.yaml",
        include_str!("../blueprints/openstack-instance.yaml"),
    ),
    (
        "builtin:openstack-instance-v1beta1.yaml",
        include_str!("../blueprints/openstack-instance-v1beta1.yaml"),
    ),
];

/// One loaded entry and the file it came from.
#[derive(Debug, Clone)]
pub struct Entry {
    pub blueprint: Blueprint,
    pub version_id: Uuid,
    /// `builtin:<name>.yaml` or the operator's file path.
    pub source: String,
}

/// Every blueprint version the server offers.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    by_id: BTreeMap<Uuid, Entry>,
}

impl Catalog {
    /// An empty catalog.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The built-in blueprints only.
    pub fn builtin() -> Result<Self, BlueprintError> {
        let mut c = Self::empty();
        for (label, text) in BUILTIN {
            c.add_text(label, text)?;
        }
        Ok(c)
    }

    /// Adds one blueprint from its file text. `source` labels errors and the entry.
    pub fn add_text(&mut self, source: &str, text: &str) -> Result<Uuid, BlueprintError> {
        let blueprint = Blueprint::parse(source, text)?;
        let version_id = blueprint.version_id();
        if let Some(first) = self.by_id.get(&version_id) {
            return Err(BlueprintError::Duplicate {
                at: source.to_owned(),
                first: first.source.clone(),
                name: blueprint.name,
                version: blueprint.version,
            });
        }
        self.by_id.insert(
            version_id,
            Entry {
                blueprint,
                version_id,
                source: source.to_owned(),
            },
        );
        Ok(version_id)
    }

    /// Reads and adds one blueprint file (blocking `std::fs`: call it at start-up).
    pub fn add_file(&mut self, path: &Path) -> Result<Uuid, BlueprintError> {
        let label = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| BlueprintError::Read {
            at: label.clone(),
            reason: e.to_string(),
        })?;
        self.add_text(&label, &text)
    }

    /// Adds every `*.yaml` / `*.yml` file of a directory, in name order; a file path is added
    /// as itself. The first bad file stops the load (a half-loaded catalog is worse than none).
    pub fn add_path(&mut self, path: &Path) -> Result<Vec<Uuid>, BlueprintError> {
        if !path.is_dir() {
            return self.add_file(path).map(|id| vec![id]);
        }
        let read_err = |e: std::io::Error| BlueprintError::Read {
            at: path.display().to_string(),
            reason: e.to_string(),
        };
        let mut files = Vec::new();
        for item in std::fs::read_dir(path).map_err(read_err)? {
            let p = item.map_err(read_err)?.path();
            let yaml = p.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if yaml && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
        files.iter().map(|f| self.add_file(f)).collect()
    }

    /// The entry with this version id.
    pub fn get(&self, version_id: &Uuid) -> Option<&Entry> {
        self.by_id.get(version_id)
    }

    /// The entry named `name` at `version`.
    pub fn find(&self, name: &str, version: &str) -> Option<&Entry> {
        self.get(&crate::blueprint::version_id(name, version))
    }

    /// Every entry, ordered by name then version.
    pub fn entries(&self) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.by_id.values().collect();
        v.sort_by(|a, b| {
            (&a.blueprint.name, &a.blueprint.version)
                .cmp(&(&b.blueprint.name, &b.blueprint.version))
        });
        v
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blueprint::{BLUEPRINT_NAMESPACE, Class, Substrate};

    #[test]
    fn namespace_is_derived_as_documented_and_ids_are_pinned() {
        assert_eq!(
            BLUEPRINT_NAMESPACE,
            Uuid::new_v5(&Uuid::NAMESPACE_URL, b"urn:plexsphere:blueprint")
        );
        // Pinned: changing these breaks every stored resource's blueprint_version_id.
        // Pinned (Python's uuid.uuid5 agrees): changing one breaks every stored resource's
        // blueprint_version_id.
        let c = Catalog::builtin().unwrap();
        for (name, version, id) in [
            (
                "local-machine",
                "v1",
                "fb0140df-68bd-59fe-8fce-6a2e52670d77",
            ),
            ("local-bucket", "v1", "0fdf0a8c-d3fe-5102-bdb1-00e8c6fee5c6"),
            (
                "openstack-instance",
                "v1alpha2",
                "d3c8490f-c357-56b0-8ec9-79f16635600f",
            ),
            (
                "openstack-instance",
                "v1beta1",
                "2c7c2d7f-50f8-5c82-bf4a-5cc12a6c3e10",
            ),
        ] {
            let e = c.find(name, version).unwrap();
            assert_eq!(e.version_id.to_string(), id, "{name}@{version}");
            assert_eq!(e.version_id.get_version_num(), 5);
            assert_eq!(c.get(&e.version_id).unwrap().blueprint.name, name);
        }
    }

    #[test]
    fn builtins_load_with_their_declared_shape() {
        let c = Catalog::builtin().unwrap();
        assert_eq!(c.len(), 4);
        let names: Vec<_> = c.entries().iter().map(|e| e.blueprint.label()).collect();
        assert_eq!(
            names,
            [
                "local-bucket@v1",
                "local-machine@v1",
                "openstack-instance@v1alpha2",
                "openstack-instance@v1beta1"
            ]
        );
        let lm = &c.find("local-machine", "v1").unwrap().blueprint;
        assert_eq!(
            (lm.class, lm.substrate),
            (Class::Machine, Substrate::LocalMachine)
        );
        assert_eq!(lm.resource_kind, "node");
        let names: Vec<_> = lm.parameters.keys().map(String::as_str).collect();
        assert_eq!(names, ["arch", "release"]);
        assert!(lm.parameters["release"].required);
        assert!(!lm.parameters["arch"].required);
        let lb = &c.find("local-bucket", "v1").unwrap().blueprint;
        assert_eq!(
            (lb.class, lb.substrate),
            (Class::Standalone, Substrate::LocalDirectory)
        );
        assert!(lb.parameters["region"].required);
        let os = &c.find("openstack-instance", "v1alpha2").unwrap().blueprint;
        assert_eq!(os.substrate, Substrate::Crossplane);
        assert_eq!(os.composite.kind, "XOpenStackInstance");
        let required: Vec<_> = os
            .parameters
            .iter()
            .filter(|(_, p)| p.required)
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(required, ["flavorName", "imageName", "networkName"]);
        assert!(!os.parameters["availabilityZone"].required);
        let osb = &c.find("openstack-instance", "v1beta1").unwrap().blueprint;
        assert_eq!(
            (osb.class, osb.substrate),
            (Class::Machine, Substrate::OpenStack)
        );
        let names: Vec<_> = osb.parameters.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "availabilityZone",
                "configDrive",
                "flavorName",
                "imageName",
                "keyName",
                "networkName"
            ]
        );
        let required: Vec<_> = osb
            .parameters
            .iter()
            .filter(|(_, p)| p.required)
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(required, ["flavorName", "imageName", "networkName"]);
        assert_eq!(
            osb.parameters["configDrive"].default,
            Some(serde_json::Value::Bool(false))
        );
    }

    #[test]
    fn a_duplicate_names_both_files() {
        let mut c = Catalog::builtin().unwrap();
        let e = c
            .add_text("/etc/plexsphere/blueprints/mine.yaml", BUILTIN[0].1)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/plexsphere/blueprints/mine.yaml: blueprint local-machine@v1 is also defined in builtin:local-machine.yaml; give one of them another version"
        );
    }

    #[test]
    fn files_and_directories_load_and_a_bad_file_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = BUILTIN[1].1.replace("version: v1", "version: v2");
        std::fs::write(dir.path().join("a.yaml"), good).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let mut c = Catalog::builtin().unwrap();
        let ids = c.add_path(dir.path()).unwrap();
        assert_eq!(ids.len(), 1);
        assert!(c.find("local-bucket", "v2").is_some());

        let bad = dir.path().join("b.yaml");
        std::fs::write(
            &bad,
            "name: x\nversion: v1\nresource_kind: node\nclass: machin\n",
        )
        .unwrap();
        let e = c.add_path(dir.path()).unwrap_err().to_string();
        // a.yaml is now a duplicate of itself: the first error wins, and it names the file.
        assert!(e.contains("a.yaml"), "{e}");
        let e = Catalog::empty().add_file(&bad).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:4:", bad.display())), "{e}");
        assert!(e.contains("machin"), "{e}");

        let missing = dir.path().join("nope.yaml");
        let e = Catalog::empty().add_file(&missing).unwrap_err().to_string();
        assert!(e.starts_with("cannot read the blueprint file"), "{e}");
    }
}
