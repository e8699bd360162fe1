//! The `plexsphere` binary: everything lives in the library's `cli` module.

use clap::CommandFactory as _;

fn main() -> std::process::ExitCode {
    // `plexsphere __generate-docs DIR`: man pages and completions for the packages
    // (scripts/package).
    if let Some(dir) = plexsphere_clidoc::requested(std::env::args_os()) {
        let code = plexsphere_clidoc::run(plexsphere::cli::Cli::command(), &dir);
        return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    plexsphere::cli::main()
}
