//! The files of a backup and of the data directory it is restored into, handled without
//! following anything: every file is opened with `O_NOFOLLOW` (and `O_NONBLOCK`, so a FIFO
//! slipped in does not hang the command) and checked to be a regular file on its descriptor;
//! the backup directory is walked with `symlink_metadata` and any symlink, FIFO, socket or
//! device in it is refused; every path `restore` writes is checked component by component
//! below the data directory before the first write.

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use anyhow::Context as _;
use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::super::failure::Failure;

/// The entries (files and directories) `restore` walks in a backup directory at most: a backup
/// holds a handful; a tree larger than this is not one.
pub(crate) const MAX_BACKUP_ENTRIES: usize = 10_000;

/// What a refused entry is, for messages.
fn kind(t: fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symlink"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading: never through a symlink, only a regular file.
pub(crate) fn open_regular(path: &Path) -> Result<fs::File, Failure> {
    let flags = (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits();
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(Errno::ELOOP as i32) => {
            return Err(refused(path, "a symlink"));
        }
        Err(e) => {
            return Err(Failure::Runtime(
                anyhow::Error::new(e).context(format!("cannot read {}", path.display())),
            ));
        }
    };
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        return Err(refused(path, kind(meta.file_type())));
    }
    Ok(file)
}

fn refused(path: &Path, what: &str) -> Failure {
    Failure::Runtime(anyhow::anyhow!(
        "{} is {what}; a backup and the data directory it is restored into hold only regular files and directories (nothing is followed): remove it, or take a new backup; nothing was written",
        path.display()
    ))
}

/// Reads a small file (at most `limit` bytes) without following a symlink.
pub(crate) fn read_small(path: &Path, limit: u64) -> Result<String, Failure> {
    let file = open_regular(path)?;
    let mut text = String::new();
    file.take(limit + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {} as text", path.display()))?;
    if text.len() as u64 > limit {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{} is larger than {limit} bytes; it is not a plexsphere backup manifest",
            path.display()
        )));
    }
    Ok(text)
}

/// Streams `from` into `to` (when given), answering its SHA-256 (hex) and size.
fn digest_copy(
    mut from: fs::File,
    mut to: Option<&mut fs::File>,
) -> std::io::Result<(String, u64)> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
        if let Some(to) = to.as_deref_mut() {
            to.write_all(&buf[..n])?;
        }
        size += n as u64;
    }
    Ok((hex::encode(ctx.finish().as_ref()), size))
}

/// The SHA-256 (hex) and size of a regular file, read in pieces (a database need not fit in
/// memory), never through a symlink.
pub(crate) fn sha256_file(path: &Path) -> Result<(String, u64), Failure> {
    let file = open_regular(path)?;
    Ok(digest_copy(file, None).with_context(|| format!("cannot read {}", path.display()))?)
}

/// Walks `root` (not following anything) and refuses any entry that is neither a regular file
/// nor a directory, and a tree of more than [`MAX_BACKUP_ENTRIES`] entries.
pub(crate) fn check_tree(root: &Path) -> Result<(), Failure> {
    let mut pending = vec![root.to_owned()];
    let mut seen = 0usize;
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
            seen += 1;
            if seen > MAX_BACKUP_ENTRIES {
                return Err(Failure::Runtime(anyhow::anyhow!(
                    "{} holds more than {MAX_BACKUP_ENTRIES} entries; it is not a plexsphere backup",
                    root.display()
                )));
            }
            let path = entry.path();
            let t = fs::symlink_metadata(&path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .file_type();
            if t.is_dir() {
                pending.push(path);
            } else if !t.is_file() {
                return Err(refused(&path, kind(t)));
            }
        }
    }
    Ok(())
}

/// A path a manifest names: relative, plain components only (no `..`, no root), UTF-8 without
/// control characters.
pub(crate) fn plain_relative(text: &str) -> Option<PathBuf> {
    if text.is_empty() || text.chars().any(char::is_control) {
        return None;
    }
    let path = PathBuf::from(text);
    path.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(path)
}

/// Checks the path `restore` would write for `rel` below `data_dir`: every directory on the
/// way that exists is a real directory (not a symlink to one), and the file itself is absent
/// or a regular file. Writes nothing.
pub(crate) fn check_write_path(data_dir: &Path, rel: &Path) -> Result<(), Failure> {
    let mut at = data_dir.to_owned();
    let parts: Vec<_> = rel.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = match fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(Failure::Runtime(
                    anyhow::Error::new(e).context(format!("cannot read {}", at.display())),
                ));
            }
        };
        let last = i + 1 == parts.len();
        let fine = if last { meta.is_file() } else { meta.is_dir() };
        if !fine {
            return Err(refused(&at, kind(meta.file_type())));
        }
    }
    Ok(())
}

/// Creates `dir` (0700); it must not exist yet or be empty.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), Failure> {
    if dir.exists() {
        let empty = fs::read_dir(dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .next()
            .is_none();
        if !empty {
            return Err(Failure::Config(format!(
                "{} exists and is not empty; name a new directory for the backup",
                dir.display()
            )));
        }
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    Ok(())
}

/// Creates the directories of `rel` below `base` one by one (0700), never through a symlink:
/// an existing component must be a real directory.
pub(crate) fn create_dirs_below(base: &Path, rel: &Path) -> Result<(), Failure> {
    let mut at = base.to_owned();
    for part in rel.components() {
        at.push(part);
        match fs::create_dir(&at) {
            Ok(()) => fs::set_permissions(&at, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot set the mode of {}", at.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let meta = fs::symlink_metadata(&at)
                    .with_context(|| format!("cannot read {}", at.display()))?;
                if !meta.is_dir() {
                    return Err(refused(&at, kind(meta.file_type())));
                }
            }
            Err(e) => {
                return Err(Failure::Runtime(
                    anyhow::Error::new(e).context(format!("cannot create {}", at.display())),
                ));
            }
        }
    }
    Ok(())
}

/// Copies the regular file `src` to `dst` (0600, synced, renamed into place: a symlink at
/// `dst` is replaced, never followed), streaming; answers the copy's SHA-256 and size. With
/// `expect`, a copy of other bytes (the source changed since it was checked) is removed and
/// refused.
pub(crate) fn copy_private(
    src: &Path,
    dst: &Path,
    expect: Option<(&str, Option<u64>)>,
) -> Result<(String, u64), Failure> {
    let from = open_regular(src)?;
    let tmp = dst.with_extension("tmp");
    match fs::symlink_metadata(&tmp) {
        Ok(m) if m.is_file() => {
            let _ = fs::remove_file(&tmp);
        }
        Ok(m) => return Err(refused(&tmp, kind(m.file_type()))),
        Err(_) => {}
    }
    let copied = (|| {
        let mut to = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(&tmp)?;
        let got = digest_copy(from, Some(&mut to))?;
        to.sync_all()?;
        Ok::<_, std::io::Error>(got)
    })();
    let got = match copied {
        Ok(got) => got,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(Failure::Runtime(anyhow::Error::new(e).context(format!(
                "cannot copy {} to {}",
                src.display(),
                dst.display()
            ))));
        }
    };
    if let Some((digest, size)) = expect
        && (got.0 != digest || size.is_some_and(|s| s != got.1))
    {
        let _ = fs::remove_file(&tmp);
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{} changed while it was restored (SHA-256 {}, manifest {digest}); the backup is being written to: restore from a copy nobody else writes",
            src.display(),
            got.0
        )));
    }
    if let Err(e) = fs::rename(&tmp, dst) {
        let _ = fs::remove_file(&tmp);
        return Err(Failure::Runtime(
            anyhow::Error::new(e).context(format!("cannot write {}", dst.display())),
        ));
    }
    Ok(got)
}

/// Writes `bytes` to `path` (0600, synced, renamed into place).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    crate::tls::write_private(path, bytes).map_err(|e| Failure::Runtime(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_and_fifos_are_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"secret").unwrap();
        let tree = dir.path().join("tree");
        fs::create_dir_all(tree.join("sub")).unwrap();
        fs::write(tree.join("sub").join("f"), b"x").unwrap();
        check_tree(&tree).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("sub").join("link")).unwrap();
        let Err(Failure::Runtime(e)) = check_tree(&tree) else {
            panic!("a symlink passed");
        };
        assert!(e.to_string().contains("is a symlink"), "{e}");
        let Err(Failure::Runtime(e)) = open_regular(&tree.join("sub").join("link")) else {
            panic!("a symlink was opened");
        };
        assert!(e.to_string().contains("is a symlink"), "{e}");
        fs::remove_file(tree.join("sub").join("link")).unwrap();
        nix::unistd::mkfifo(&tree.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(check_tree(&tree).is_err());
        assert!(open_regular(&tree.join("fifo")).is_err());
    }

    #[test]
    fn write_paths_through_a_symlinked_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (data, elsewhere) = (dir.path().join("data"), dir.path().join("elsewhere"));
        fs::create_dir_all(&data).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        check_write_path(&data, Path::new("tls/ca.crt")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, data.join("tls")).unwrap();
        assert!(check_write_path(&data, Path::new("tls/ca.crt")).is_err());
        assert!(create_dirs_below(&data, Path::new("tls")).is_err());
        assert_eq!(
            plain_relative("tls/ca.crt"),
            Some(PathBuf::from("tls/ca.crt"))
        );
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "a\nb", "./a"] {
            assert_eq!(plain_relative(bad), None, "{bad:?}");
        }
    }
}
