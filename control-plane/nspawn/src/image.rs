//! The Debian base image every machine boots from, built once per recipe and cached.
//!
//! `<cache_dir>/<suite>-<recipe hash>/rootfs` is complete by construction: the image is built
//! in `<cache_dir>/.build-<suite>-<hash>-<pid>/` and renamed into place only when every step
//! succeeded. A lock file (`<cache_dir>/<suite>-<hash>.lock`) keeps two processes from building
//! the same image at once; the second waits and then reuses the first one's result.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use crate::cmd::{Tool, run_ok};
use crate::error::{Error, Result};
use crate::procfs::{mount_points, mounts_under};
use crate::recipe::{ImageFile, Recipe, host_mirror};
use crate::rootfs;
use crate::wait::{POLL_SLOW, poll_until};

const DEBOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const APT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a second process waits for another one's build.
const LOCK_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// A complete, cached root file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseImage {
    dir: PathBuf,
}

impl BaseImage {
    /// The bookworm image of [`Recipe::bookworm`], fetched from this host's Debian mirror:
    /// reused when `cache_dir` has it, else built (about a minute and a half).
    pub fn ensure(cache_dir: &Path) -> Result<BaseImage> {
        let recipe = Recipe::bookworm();
        let mirror = host_mirror(&recipe.suite);
        BaseImage::ensure_with(cache_dir, &recipe, &mirror)
    }

    /// Reuses or builds the image of `recipe` under `cache_dir`, packages from `mirror`.
    pub fn ensure_with(cache_dir: &Path, recipe: &Recipe, mirror: &str) -> Result<BaseImage> {
        let image = BaseImage {
            dir: cache_dir.join(recipe.dir_name()),
        };
        if image.is_complete() {
            tracing::debug!(image = %image.dir.display(), "base image reused");
            return Ok(image);
        }
        std::fs::create_dir_all(cache_dir)
            .map_err(|e| Error::io("creating the image cache directory", cache_dir, e))?;
        let _lock = lock(&cache_dir.join(format!("{}.lock", recipe.dir_name())))?;
        // Another process may have built it while this one waited for the lock.
        if image.is_complete() {
            return Ok(image);
        }
        remove_stale_builds(cache_dir, &recipe.dir_name())?;
        let tmp = cache_dir.join(format!(
            ".build-{}-{}",
            recipe.dir_name(),
            std::process::id()
        ));
        tracing::info!(image = %image.dir.display(), mirror, "building the base image (debootstrap, then cloud-init)");
        if let Err(e) = build(&tmp, recipe, mirror) {
            // A failed build leaves nothing that could be mistaken for an image.
            let _ = remove_tree(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &image.dir)
            .map_err(|e| Error::io("moving the finished image into place", &image.dir, e))?;
        tracing::info!(image = %image.dir.display(), "base image built");
        Ok(image)
    }

    /// The image's root, the lower layer of every machine.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// `<cache_dir>/<suite>-<hash>`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// An image directory that a previous `ensure` produced (for a restarted server).
    pub fn open(dir: &Path) -> Result<BaseImage> {
        let image = BaseImage {
            dir: dir.to_path_buf(),
        };
        if image.is_complete() {
            Ok(image)
        } else {
            Err(Error::io(
                "opening the base image (run BaseImage::ensure to build it)",
                dir,
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ))
        }
    }

    fn is_complete(&self) -> bool {
        self.rootfs().join("usr/lib/os-release").is_file()
    }
}

fn lock(path: &Path) -> Result<Flock<File>> {
    let open = || {
        File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| Error::io("opening the image build lock", path, e))
    };
    let mut file = Some(open()?);
    let mut announced = false;
    poll_until(
        "waiting for another process's image build",
        LOCK_TIMEOUT,
        POLL_SLOW,
        "another process holds the build lock; check it is still running, or remove the lock file's holder",
        || {
            let f = match file.take() {
                Some(f) => f,
                None => open()?,
            };
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => Ok(Some(lock)),
                Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                    if !announced {
                        tracing::info!(lock = %path.display(), "another process is building the base image; waiting for it");
                        announced = true;
                    }
                    file = Some(f);
                    Ok(None)
                }
                Err((_, errno)) => Err(Error::sys("locking the image build", path, errno)),
            }
        },
    )
}

/// Removes `.build-<name>-*` left by a build that crashed (only called under the lock).
fn remove_stale_builds(cache_dir: &Path, name: &str) -> Result<()> {
    let prefix = format!(".build-{name}-");
    let entries = std::fs::read_dir(cache_dir)
        .map_err(|e| Error::io("listing the image cache", cache_dir, e))?;
    for entry in entries.filter_map(|e| e.ok()) {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            tracing::info!(dir = %entry.path().display(), "removing a half-built image");
            remove_tree(&entry.path())?;
        }
    }
    Ok(())
}

/// Removes the images of other recipes of `recipe`'s suite that no mounted machine uses (their
/// root is no overlay's `lowerdir`); a changed recipe otherwise leaves ~260 MB behind. Not
/// called by `ensure`: another version of this code may share the cache and be about to boot
/// from one of them, so call it when this process is the cache's only user.
pub fn prune_unused(cache_dir: &Path, recipe: &Recipe, keep: &BaseImage) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !is_other_image(&name, recipe, keep) || !path.is_dir() {
            continue;
        }
        if in_use(&mountinfo, &path.join("rootfs")) {
            tracing::info!(image = %path.display(), "an older image is still used by a machine; keeping it");
            continue;
        }
        match remove_tree(&path) {
            Ok(()) => {
                tracing::info!(image = %path.display(), "removed an image of an older recipe")
            }
            Err(e) => {
                tracing::warn!(image = %path.display(), error = %e, "could not remove an older image")
            }
        }
    }
}

/// `<suite>-<16 hex digits>` other than `keep`'s own name.
fn is_other_image(name: &str, recipe: &Recipe, keep: &BaseImage) -> bool {
    let Some(hash) = name.strip_prefix(&format!("{}-", recipe.suite)) else {
        return false;
    };
    hash.len() == 16
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
        && keep.dir.file_name().is_none_or(|k| k != name)
}

/// Whether an overlay in `mountinfo` has `rootfs` as a lower layer.
fn in_use(mountinfo: &str, rootfs: &Path) -> bool {
    let needle = rootfs.to_string_lossy();
    mountinfo.lines().any(|l| {
        l.split([',', ' ', ':'])
            .any(|opt| opt.strip_prefix("lowerdir=").unwrap_or(opt) == needle)
    })
}

/// Removes a directory tree, refusing when anything below it is still mounted (removing
/// through a mount would delete the mounted file system's files).
pub(crate) fn remove_tree(dir: &Path) -> Result<()> {
    if let Some(mount) = mounts_under(&mount_points(), dir).into_iter().next() {
        return Err(Error::StillMounted {
            dir: dir.to_path_buf(),
            mount,
        });
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("removing a directory", dir, e)),
    }
}

fn build(tmp: &Path, recipe: &Recipe, mirror: &str) -> Result<()> {
    std::fs::create_dir_all(tmp).map_err(|e| Error::io("creating the build directory", tmp, e))?;
    let root = tmp.join("rootfs");

    let mut cmd = Tool::Debootstrap.command()?;
    cmd.arg("--variant=minbase")
        .arg(format!("--include={}", recipe.include.join(",")))
        .arg(&recipe.suite)
        .arg(&root)
        .arg(mirror);
    run_ok(
        cmd,
        &format!("bootstrapping Debian {} from {mirror}", recipe.suite),
        DEBOOTSTRAP_TIMEOUT,
    )?;

    if !recipe.extra.is_empty() {
        let mut install = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
        install.extend(recipe.extra.iter().map(String::as_str));
        run_ok(
            in_root(&root, &install)?,
            "installing packages in the image",
            APT_TIMEOUT,
        )?;
    }
    run_ok(
        in_root(
            &root,
            &["sh", "-c", "apt-get clean && rm -rf /var/lib/apt/lists/*"],
        )?,
        "cleaning apt's caches in the image",
        STEP_TIMEOUT,
    )?;

    for file in &recipe.files {
        match file {
            ImageFile::Text {
                path,
                contents,
                mode,
            } => {
                rootfs::write_file(&root, path, contents.as_bytes(), *mode)?;
            }
            ImageFile::Mask { path } => rootfs::mask(&root, path)?,
        }
    }
    // Every machine must get its own machine-id: an empty file makes systemd generate one at
    // boot (debootstrap's systemd postinst wrote a fixed one). D-Bus reads the same id.
    rootfs::write_file(&root, "/etc/machine-id", b"", 0o444)?;
    let dbus_id = root.join("var/lib/dbus/machine-id");
    if std::fs::symlink_metadata(&dbus_id).is_ok() {
        std::fs::remove_file(&dbus_id)
            .map_err(|e| Error::io("replacing D-Bus's machine-id", &dbus_id, e))?;
    }
    if dbus_id.parent().is_some_and(Path::is_dir) {
        std::os::unix::fs::symlink("/etc/machine-id", &dbus_id)
            .map_err(|e| Error::io("linking D-Bus's machine-id", &dbus_id, e))?;
    }

    for unit in &recipe.enable {
        let mut cmd = Tool::Systemctl.command()?;
        cmd.arg(format!("--root={}", root.display()))
            .arg("enable")
            .arg(unit);
        run_ok(cmd, &format!("enabling {unit} in the image"), STEP_TIMEOUT)?;
    }

    let manifest = tmp.join("recipe.txt");
    std::fs::write(
        &manifest,
        format!("{}mirror {mirror}\n", recipe.canonical()),
    )
    .map_err(|e| Error::io("writing the image's recipe", &manifest, e))?;
    Ok(())
}

/// A command run inside the image root by systemd-nspawn (a chroot that also sets up /proc,
/// /dev and /sys and tears them down with it, so a crash leaves no mounts behind). It shares
/// the host's network to reach the mirror.
fn in_root(root: &Path, argv: &[&str]) -> Result<std::process::Command> {
    let mut cmd = Tool::SystemdNspawn.command()?;
    cmd.arg("--quiet")
        .arg("--register=no")
        .arg("--keep-unit")
        .arg("--pipe")
        .arg("--setenv=DEBIAN_FRONTEND=noninteractive")
        .arg("--setenv=LC_ALL=C.UTF-8")
        .arg("-D")
        .arg(root)
        .arg("--")
        .args(argv);
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incomplete_image_is_not_opened() {
        let cache = tempfile::tempdir().unwrap();
        let dir = cache.path().join("bookworm-0000");
        std::fs::create_dir_all(dir.join("rootfs/usr/lib")).unwrap();
        assert!(BaseImage::open(&dir).is_err());
        std::fs::write(dir.join("rootfs/usr/lib/os-release"), "ID=debian\n").unwrap();
        let image = BaseImage::open(&dir).unwrap();
        assert_eq!(image.rootfs(), dir.join("rootfs"));
    }

    #[test]
    fn a_cached_image_is_reused_without_building() {
        // No debootstrap runs here: the mirror is unreachable on purpose, so a build would fail.
        let cache = tempfile::tempdir().unwrap();
        let recipe = Recipe::bookworm();
        let dir = cache.path().join(recipe.dir_name());
        std::fs::create_dir_all(dir.join("rootfs/usr/lib")).unwrap();
        std::fs::write(dir.join("rootfs/usr/lib/os-release"), "ID=debian\n").unwrap();
        let image =
            BaseImage::ensure_with(cache.path(), &recipe, "http://127.0.0.1:9/debian").unwrap();
        assert_eq!(image.dir(), dir);
    }

    #[test]
    fn stale_builds_are_removed_and_other_entries_kept() {
        let cache = tempfile::tempdir().unwrap();
        let stale = cache.path().join(".build-bookworm-abc-123/rootfs/etc");
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::create_dir_all(cache.path().join(".build-bookworm-other-1")).unwrap();
        std::fs::create_dir_all(cache.path().join("bookworm-abc")).unwrap();
        remove_stale_builds(cache.path(), "bookworm-abc").unwrap();
        assert!(!cache.path().join(".build-bookworm-abc-123").exists());
        assert!(cache.path().join(".build-bookworm-other-1").exists());
        assert!(cache.path().join("bookworm-abc").exists());
    }

    #[test]
    fn only_other_images_of_the_suite_are_pruned() {
        let recipe = Recipe::bookworm();
        let keep = BaseImage {
            dir: PathBuf::from("/c").join(recipe.dir_name()),
        };
        assert!(is_other_image("bookworm-0123456789abcdef", &recipe, &keep));
        assert!(!is_other_image(&recipe.dir_name(), &recipe, &keep));
        assert!(!is_other_image(
            "bookworm-0123456789abcdef.lock",
            &recipe,
            &keep
        ));
        assert!(!is_other_image(
            ".build-bookworm-0123456789abcdef-1",
            &recipe,
            &keep
        ));
        assert!(!is_other_image("trixie-0123456789abcdef", &recipe, &keep));
        assert!(!is_other_image("bookworm-mine", &recipe, &keep));
    }

    #[test]
    fn an_image_under_an_overlay_is_in_use() {
        let info = "95 22 0:50 / /s/machines/a/merged rw,relatime - overlay plexsphere-a \
                    rw,lowerdir=/c/bookworm-1/rootfs,upperdir=/s/machines/a/upper,workdir=/s/machines/a/work\n";
        assert!(in_use(info, Path::new("/c/bookworm-1/rootfs")));
        assert!(!in_use(info, Path::new("/c/bookworm-2/rootfs")));
        assert!(!in_use(info, Path::new("/c/bookworm-1")));
    }

    #[test]
    fn the_lock_is_exclusive_within_the_bound() {
        let cache = tempfile::tempdir().unwrap();
        let path = cache.path().join("x.lock");
        let held = lock(&path).unwrap();
        let second = File::options().write(true).open(&path).unwrap();
        assert!(Flock::lock(second, FlockArg::LockExclusiveNonblock).is_err());
        drop(held);
        assert!(lock(&path).is_ok());
    }
}
