//! The portable binaries `scripts/dist` builds (static musl, amd64 and arm64), where the tests
//! find them (`PLEXSPHERE_DIST_DIR`), how they run (natively or under qemu-user), and what
//! their ELF headers say about linking.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

/// The directory `scripts/dist` wrote; `scripts/test` exports it.
pub const DIST_DIR_ENV: &str = "PLEXSPHERE_DIST_DIR";
/// Debian's qemu-user-static: runs an arm64 binary on an amd64 host, no binfmt needed.
pub const QEMU_AARCH64: &str = "qemu-aarch64-static";

/// An architecture the downloads serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// The name in the downloads' file names (`plexd-linux-<arch>`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// What `uname -m` prints on a machine of this architecture.
    pub fn uname_machine(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// The ELF `e_machine` of its binaries (EM_X86_64, EM_AARCH64).
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => 62,
            Arch::Arm64 => 183,
        }
    }

    /// The emulator that runs its binaries here, when this host is not of that architecture
    /// (the tests run on amd64).
    pub fn runner(self) -> Option<&'static str> {
        match self {
            Arch::Amd64 => None,
            Arch::Arm64 => Some(QEMU_AARCH64),
        }
    }
}

/// The dist directory; an error saying to run `scripts/dist` when it is not set or lacks a
/// binary.
pub fn dist_dir() -> Result<PathBuf> {
    let Some(dir) = std::env::var_os(DIST_DIR_ENV) else {
        bail!(
            "{DIST_DIR_ENV} is not set: run scripts/dist first, then export {DIST_DIR_ENV}=/var/cache/plexsphere/dist (scripts/test does both)"
        );
    };
    let dir = PathBuf::from(dir);
    for arch in [Arch::Amd64, Arch::Arm64] {
        for name in ["plexd", "plexctl"] {
            let path = dir.join(file_name(name, arch));
            ensure!(
                path.is_file(),
                "{} is missing: run scripts/dist first (it writes into {DIST_DIR_ENV})",
                path.display()
            );
        }
    }
    ensure!(
        dir.join("checksums.sha256").is_file(),
        "{} has no checksums.sha256: run scripts/dist first",
        dir.display()
    );
    Ok(dir)
}

/// `plexd-linux-arm64`.
pub fn file_name(bin: &str, arch: Arch) -> String {
    format!("{bin}-linux-{}", arch.name())
}

/// A command that runs `binary` (of `arch`) on this host: directly, or under its emulator,
/// which must be installed (an error names the Debian package otherwise).
pub fn command(arch: Arch, binary: &Path) -> Result<Command> {
    match arch.runner() {
        None => Ok(Command::new(binary)),
        Some(runner) => {
            let found = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).any(|d| d.join(runner).is_file()))
                .unwrap_or(false);
            ensure!(
                found,
                "{runner} is not on PATH: install Debian's qemu-user-static (scripts/deps.sh does)"
            );
            let mut cmd = Command::new(runner);
            cmd.arg(binary);
            Ok(cmd)
        }
    }
}

/// What an ELF file's headers say about how it links.
#[derive(Debug, PartialEq, Eq)]
pub struct ElfLinking {
    pub machine: u16,
    /// A `PT_INTERP` program header: the binary needs a dynamic loader.
    pub interpreter: bool,
    /// The number of `DT_NEEDED` entries: shared libraries it needs.
    pub needed: usize,
}

impl ElfLinking {
    /// Static: no loader and no shared library (a static-pie still has a dynamic section,
    /// for its own relocations, but needs nothing).
    pub fn is_static(&self) -> bool {
        !self.interpreter && self.needed == 0
    }
}

/// The largest binary read whole (the dist binaries are a few tens of MiB).
const MAX_ELF_BYTES: u64 = 512 << 20;

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;

/// Reads a 64-bit little-endian ELF file's program headers and dynamic section.
pub fn elf_linking(path: &Path) -> Result<ElfLinking> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    ensure!(
        len <= MAX_ELF_BYTES,
        "{} is {len} bytes, more than the {MAX_ELF_BYTES} this check reads",
        path.display()
    );
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_elf(&bytes)
        .with_context(|| format!("{} is not a 64-bit little-endian ELF", path.display()))
}

fn parse_elf(b: &[u8]) -> Result<ElfLinking> {
    ensure!(b.get(..4) == Some(b"\x7fELF".as_slice()), "no ELF magic");
    ensure!(
        b.get(4) == Some(&2) && b.get(5) == Some(&1),
        "not ELFCLASS64 / ELFDATA2LSB"
    );
    let machine = u16_at(b, 18)?;
    let phoff = usize::try_from(u64_at(b, 32)?)?;
    let phentsize = usize::from(u16_at(b, 54)?);
    let phnum = usize::from(u16_at(b, 56)?);
    ensure!(
        phentsize >= 56,
        "program header entries of {phentsize} bytes"
    );
    let mut linking = ElfLinking {
        machine,
        interpreter: false,
        needed: 0,
    };
    for i in 0..phnum {
        let ph = phoff.saturating_add(i.saturating_mul(phentsize));
        match u32_at(b, ph)? {
            PT_INTERP => linking.interpreter = true,
            PT_DYNAMIC => {
                let off = usize::try_from(u64_at(b, ph + 8)?)?;
                let size = usize::try_from(u64_at(b, ph + 32)?)?;
                for entry in (off..off.saturating_add(size)).step_by(16) {
                    match u64_at(b, entry)? {
                        DT_NULL => break,
                        DT_NEEDED => linking.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(linking)
}

fn field<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N]> {
    b.get(at..at.saturating_add(N))
        .and_then(|s| s.try_into().ok())
        .with_context(|| format!("truncated at byte {at}"))
}
fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(field(b, at)?))
}
fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(field(b, at)?))
}
fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(field(b, at)?))
}
