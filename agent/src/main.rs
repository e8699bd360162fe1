//! The `plexd` binary: parse the command line, hand it to the library, exit with its status.

use clap::{CommandFactory as _, Parser as _};

fn main() {
    // `plexd __generate-docs DIR`: man pages and completions for the packages (scripts/package).
    if let Some(dir) = plexsphere_clidoc::requested(std::env::args_os()) {
        std::process::exit(plexsphere_clidoc::run(plexd::cli::Cli::command(), &dir));
    }
    let cli = match plexd::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors; everything else is a usage error (64).
            let status = if e.use_stderr() {
                plexd::exit::ExitCode::Usage.as_i32()
            } else {
                0
            };
            let _ = e.print();
            std::process::exit(status);
        }
    };
    std::process::exit(plexd::app::main(cli));
}
