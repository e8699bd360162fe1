//! Man pages and shell completions from a binary's clap definition, for the packages.
//!
//! Each binary (plexd, plexsphere, plexctl) answers `<binary> __generate-docs <dir>` before it
//! parses its command line (the word is not a subcommand, so `--help` never shows it), and
//! writes into `<dir>`:
//!
//! | path                                  | what                                         |
//! |---------------------------------------|----------------------------------------------|
//! | `man/<name>.1`, `man/<name>-<sub>.1`  | man pages (section 1), one per subcommand    |
//! | `completions/bash/<name>`             | for /usr/share/bash-completion/completions   |
//! | `completions/zsh/_<name>`             | for /usr/share/zsh/vendor-completions        |
//! | `completions/fish/<name>.fish`        | for /usr/share/fish/vendor_completions.d     |
//!
//! `scripts/package` runs it; nothing generated is kept in git.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;

/// The first argument that asks a binary for its docs instead of running it.
pub const TRIGGER: &str = "__generate-docs";

/// The shells completions are written for.
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// A failure to write one of the files.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the {what} into {dir}: {source}")]
pub struct Error {
    what: &'static str,
    dir: PathBuf,
    source: std::io::Error,
}

/// The output directory when the command line is exactly `<binary> __generate-docs <dir>`.
pub fn requested(args: impl IntoIterator<Item = OsString>) -> Option<PathBuf> {
    let mut args = args.into_iter().skip(1);
    let (first, dir) = (args.next()?, args.next()?);
    (first == TRIGGER && args.next().is_none()).then(|| PathBuf::from(dir))
}

/// Writes the man pages and completions of `cmd` under `dir` (layout in the module docs).
pub fn write(cmd: Command, dir: &Path) -> Result<(), Error> {
    let mut cmd = cmd;
    cmd.build();
    let name = cmd.get_name().to_owned();
    let man = dir.join("man");
    let fail = |what, dir: &Path| {
        let dir = dir.to_path_buf();
        move |source| Error { what, dir, source }
    };
    std::fs::create_dir_all(&man).map_err(fail("man pages", &man))?;
    man_pages(&cmd, &man).map_err(fail("man pages", &man))?;
    for shell in SHELLS {
        let out = dir.join("completions").join(shell.to_string());
        std::fs::create_dir_all(&out).map_err(fail("completions", &out))?;
        let mut file = std::fs::File::create(out.join(completion_file(shell, &name)))
            .map_err(fail("completions", &out))?;
        clap_complete::generate(shell, &mut cmd, &name, &mut file);
    }
    Ok(())
}

/// One page per command and subcommand (`plexctl-node-list.1`), leaving out hidden ones and
/// clap's `help` subcommands (each page already shows the help).
fn man_pages(cmd: &Command, dir: &Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            man_pages(sub, dir)?;
        }
    }
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    let mut file = std::fs::File::create(dir.join(format!("{name}.1")))?;
    clap_mangen::Man::new(cmd.clone()).render(&mut file)
}

/// The file name each shell's completion directory expects for the command `name`.
fn completion_file(shell: Shell, name: &str) -> String {
    match shell {
        Shell::Zsh => format!("_{name}"),
        Shell::Fish => format!("{name}.fish"),
        _ => name.to_owned(),
    }
}

/// What a binary's `main` calls when [`requested`] matched: writes, reports, and returns the
/// process exit code (0, or 74 when a file could not be written).
pub fn run(cmd: Command, dir: &Path) -> i32 {
    match write(cmd, dir) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            74
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn only_the_exact_form_asks_for_docs() {
        assert_eq!(
            requested(args(&["plexd", TRIGGER, "/tmp/d"])),
            Some(PathBuf::from("/tmp/d"))
        );
        assert_eq!(requested(args(&["plexd", TRIGGER])), None);
        assert_eq!(requested(args(&["plexd", TRIGGER, "a", "b"])), None);
        assert_eq!(requested(args(&["plexd", "run", "/tmp/d"])), None);
        assert_eq!(requested(args(&["plexd"])), None);
    }

    #[test]
    fn writes_a_page_per_subcommand_and_three_completions() {
        let cmd = Command::new("demo")
            .about("A demo tool.")
            .subcommand(Command::new("join").about("Join the mesh."))
            .subcommand(Command::new("leave").about("Leave the mesh."));
        let dir = tempfile::tempdir().unwrap();
        write(cmd, dir.path()).unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert!(read("man/demo.1").contains("A demo tool."));
        assert!(read("man/demo-join.1").contains("Join the mesh."));
        assert!(read("man/demo-leave.1").contains("Leave the mesh."));
        assert!(!dir.path().join("man/demo-help.1").exists());
        assert!(read("completions/bash/demo").contains("join"));
        assert!(read("completions/zsh/_demo").contains("#compdef demo"));
        assert!(read("completions/fish/demo.fish").contains("leave"));
    }

    #[test]
    fn an_unwritable_dir_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = write(Command::new("demo"), &file).unwrap_err().to_string();
        assert!(e.contains("man pages") && e.contains("file/man"), "{e}");
    }
}
