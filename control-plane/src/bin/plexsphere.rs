//! The `plexsphere` binary: everything lives in the library's `cli` module.

fn main() -> std::process::ExitCode {
    plexsphere::cli::main()
}
