//! Finding machines again from the state dir: after a restart, a server lists what a previous
//! run left under `<state_dir>/machines/`, reattaches to it (to observe or destroy it), or
//! destroys all of it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};
use crate::layer::validate_name;
use crate::machine::{Machine, Record, canonical, machine_dir};

impl Machine {
    /// Finds a machine of a previous run in `state_dir` (to observe or destroy it).
    pub fn reattach(state_dir: &Path, name: &str) -> Result<Machine> {
        validate_name(name)?;
        let base = canonical(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        let dir = machine_dir(&base, name);
        if !dir.is_dir() {
            return Err(Error::MachineNotFound {
                name: name.to_string(),
                dir: state_dir.join("machines"),
            });
        }
        let path = dir.join("machine.json");
        let record = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice::<Record>(&bytes).map_err(|e| Error::BadStateFile {
                    path: path.clone(),
                    reason: e.to_string(),
                })?
            }
            // Created but never recorded: there is no process, only files (and maybe a mount).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Record {
                name: name.to_string(),
                rootfs: PathBuf::new(),
                bridge: String::new(),
                address: Ipv4Net::default(),
                nspawn: None,
                leader: None,
            },
            Err(e) => return Err(Error::io("reading the machine's state", &path, e)),
        };
        Ok(Machine {
            dir,
            leader: Mutex::new(record.leader),
            record,
            child: Mutex::new(None),
        })
    }

    /// The names of the machines in `state_dir`, sorted.
    pub fn list(state_dir: &Path) -> Result<Vec<String>> {
        let dir = state_dir.join("machines");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("listing the machines", &dir, e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| validate_name(n).is_ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Destroys every machine a previous run left in `state_dir`; answers their names.
    pub fn destroy_leftovers(state_dir: &Path) -> Result<Vec<String>> {
        let names = Machine::list(state_dir)?;
        for name in &names {
            tracing::info!(machine = %name, "destroying a machine left by a previous run");
            Machine::reattach(state_dir, name)?.destroy()?;
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_names_only_machine_directories() {
        let state = tempfile::tempdir().unwrap();
        assert!(Machine::list(state.path()).unwrap().is_empty());
        let machines = state.path().join("machines");
        for d in ["b", "a", "Not_A_Name"] {
            std::fs::create_dir_all(machines.join(d)).unwrap();
        }
        std::fs::write(machines.join("c"), b"a file").unwrap();
        assert_eq!(Machine::list(state.path()).unwrap(), ["a", "b"]);
    }

    #[test]
    fn leftovers_without_a_record_or_a_process_are_removed() {
        // A crash between creating the directory and writing machine.json.
        let state = tempfile::tempdir().unwrap();
        let dir = machine_dir(state.path(), "half");
        std::fs::create_dir_all(dir.join("upper/etc")).unwrap();
        std::fs::write(dir.join("upper/etc/hostname"), b"half\n").unwrap();
        let m = Machine::reattach(state.path(), "half").unwrap();
        assert!(m.gone());
        assert_eq!(Machine::destroy_leftovers(state.path()).unwrap(), ["half"]);
        assert!(!dir.exists());
        m.destroy().unwrap();
        assert!(matches!(
            Machine::reattach(state.path(), "half"),
            Err(Error::MachineNotFound { .. })
        ));
    }

    #[test]
    fn a_corrupt_record_is_reported_with_its_path() {
        let state = tempfile::tempdir().unwrap();
        let dir = machine_dir(state.path(), "bad");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("machine.json"), b"{not json").unwrap();
        let err = Machine::reattach(state.path(), "bad").unwrap_err();
        assert!(matches!(err, Error::BadStateFile { .. }), "{err}");
        assert!(err.to_string().contains("machine.json"), "{err}");
    }
}
