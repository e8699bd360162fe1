//! Writing files into a machine's root from the host. Paths are resolved the way the machine
//! will see them: a symlink in the image (`/bin -> usr/bin`, or an absolute one) is followed
//! inside the root, never out of it into the host.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const MAX_SYMLINK_HOPS: usize = 40;

/// The components of an absolute path inside the machine; `..`, relative paths and NUL are
/// refused (the caller means a concrete file, not a walk).
pub fn inner_components(path: &str) -> Result<Vec<String>> {
    let bad = |reason| Error::InvalidPath {
        path: path.to_string(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(bad("it must be absolute"));
    }
    if path.contains('\0') {
        return Err(bad("it contains a NUL byte"));
    }
    let comps: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_string)
        .collect();
    if comps.iter().any(|c| c == "..") {
        return Err(bad("it contains '..'"));
    }
    if comps.is_empty() {
        return Err(bad("it names the root directory, not a file"));
    }
    Ok(comps)
}

/// Resolves the directory `comps` inside `root`, following symlinks within the root and
/// creating missing directories (mode 0755).
fn resolve_dir(root: &Path, comps: &[String], original: &str) -> Result<PathBuf> {
    let bad = |reason| Error::InvalidPath {
        path: original.to_string(),
        reason,
    };
    let mut stack: Vec<OsString> = Vec::new();
    let mut todo: VecDeque<OsString> = comps.iter().map(OsString::from).collect();
    let mut hops = 0;
    while let Some(c) = todo.pop_front() {
        if c.is_empty() || c == "." {
            continue;
        }
        if c == ".." {
            stack.pop();
            continue;
        }
        let here: PathBuf = root.join(stack.iter().collect::<PathBuf>()).join(&c);
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(bad("it runs through too many symlinks inside the machine"));
                }
                let target = std::fs::read_link(&here)
                    .map_err(|e| Error::io("reading a symlink in the machine", &here, e))?;
                if target.is_absolute() {
                    stack.clear();
                }
                for part in target.iter().rev() {
                    if part != "/" {
                        todo.push_front(part.to_os_string());
                    }
                }
            }
            Ok(m) if m.is_dir() => stack.push(c),
            Ok(_) => return Err(bad("a parent of it is a file inside the machine")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&here)
                    .map_err(|e| Error::io("creating a directory in the machine", &here, e))?;
                stack.push(c);
            }
            Err(e) => return Err(Error::io("inspecting a path in the machine", &here, e)),
        }
    }
    Ok(root.join(stack.iter().collect::<PathBuf>()))
}

/// Writes `contents` to the absolute path `inner` inside `root` with `mode`, replacing a file
/// or a symlink that is there (the symlink itself, not what it points to).
pub fn write_file(root: &Path, inner: &str, contents: &[u8], mode: u32) -> Result<PathBuf> {
    let comps = inner_components(inner)?;
    let (name, parents) = comps.split_last().ok_or(Error::InvalidPath {
        path: inner.to_string(),
        reason: "it names the root directory, not a file",
    })?;
    let dir = resolve_dir(root, parents, inner)?;
    let target = dir.join(name);
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&target)
            .map_err(|e| Error::io("replacing a symlink in the machine", &target, e))?,
        Ok(m) if m.is_dir() => {
            return Err(Error::InvalidPath {
                path: inner.to_string(),
                reason: "it is a directory inside the machine",
            });
        }
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&target)
        .map_err(|e| Error::io("writing a file into the machine", &target, e))?;
    f.write_all(contents)
        .map_err(|e| Error::io("writing a file into the machine", &target, e))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("setting a file's mode in the machine", &target, e))?;
    Ok(target)
}

/// Makes `inner` a symlink to `/dev/null` (masks a vendor file of the same name).
pub fn mask(root: &Path, inner: &str) -> Result<()> {
    let comps = inner_components(inner)?;
    let (name, parents) = comps.split_last().ok_or(Error::InvalidPath {
        path: inner.to_string(),
        reason: "it names the root directory, not a file",
    })?;
    let target = resolve_dir(root, parents, inner)?.join(name);
    if std::fs::symlink_metadata(&target).is_ok() {
        std::fs::remove_file(&target)
            .map_err(|e| Error::io("replacing a file in the image", &target, e))?;
    }
    std::os::unix::fs::symlink("/dev/null", &target)
        .map_err(|e| Error::io("masking a file in the image", &target, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn paths_must_be_absolute_and_concrete() {
        assert_eq!(
            inner_components("/etc//./hostname").unwrap(),
            ["etc", "hostname"]
        );
        for bad in ["etc/hostname", "/etc/../../host", "/", "/a\0b", ""] {
            assert!(inner_components(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn writes_create_parents_and_set_the_mode() {
        let root = tempfile::tempdir().unwrap();
        let p = write_file(
            root.path(),
            "/var/lib/cloud/seed/nocloud/user-data",
            b"#cloud-config\n",
            0o600,
        )
        .unwrap();
        assert_eq!(p, root.path().join("var/lib/cloud/seed/nocloud/user-data"));
        assert_eq!(std::fs::read(&p).unwrap(), b"#cloud-config\n");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        // Rewriting an existing file changes its mode too.
        write_file(
            root.path(),
            "/var/lib/cloud/seed/nocloud/user-data",
            b"x",
            0o644,
        )
        .unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn absolute_symlinks_stay_inside_the_root() {
        let host = tempfile::tempdir().unwrap();
        let root = host.path().join("root");
        let outside = host.path().join("outside");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        // An absolute link that would leave the root on the host.
        symlink(&outside, root.join("escape")).unwrap();
        symlink("/../../..", root.join("up")).unwrap();

        write_file(&root, "/bin/tool", b"1", 0o755).unwrap();
        assert!(root.join("usr/bin/tool").is_file());

        write_file(&root, "/escape/file", b"2", 0o644).unwrap();
        assert!(!outside.join("file").exists(), "wrote outside the root");
        let inside = root.join(outside.strip_prefix("/").unwrap()).join("file");
        assert!(inside.is_file());

        write_file(&root, "/up/etc/x", b"3", 0o644).unwrap();
        assert!(root.join("etc/x").is_file());
    }

    #[test]
    fn a_final_symlink_is_replaced_not_followed() {
        let host = tempfile::tempdir().unwrap();
        let root = host.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let victim = host.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        symlink(&victim, root.join("etc/resolv.conf")).unwrap();
        write_file(&root, "/etc/resolv.conf", b"nameserver 10.0.0.1\n", 0o644).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(
            !std::fs::symlink_metadata(root.join("etc/resolv.conf"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn symlink_loops_and_files_as_parents_are_errors() {
        let root = tempfile::tempdir().unwrap();
        symlink("loop", root.path().join("loop")).unwrap();
        assert!(write_file(root.path(), "/loop/x", b"", 0o644).is_err());
        std::fs::write(root.path().join("file"), b"").unwrap();
        assert!(write_file(root.path(), "/file/x", b"", 0o644).is_err());
        std::fs::create_dir(root.path().join("dir")).unwrap();
        assert!(write_file(root.path(), "/dir", b"", 0o644).is_err());
    }

    #[test]
    fn mask_points_at_dev_null() {
        let root = tempfile::tempdir().unwrap();
        mask(
            root.path(),
            "/etc/systemd/network/80-container-host0.network",
        )
        .unwrap();
        mask(
            root.path(),
            "/etc/systemd/network/80-container-host0.network",
        )
        .unwrap();
        let link = root
            .path()
            .join("etc/systemd/network/80-container-host0.network");
        assert_eq!(
            std::fs::read_link(link).unwrap(),
            PathBuf::from("/dev/null")
        );
    }
}
