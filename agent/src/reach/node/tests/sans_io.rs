//! The node and the engine stay sans-IO by structure: their sources (not their tests) name no
//! clock read, no OS randomness, no thread and no socket. The runtime hands them the time
//! (`Now`) and their random sources, and carries out their outputs.

use std::fs;
use std::path::{Path, PathBuf};

/// What the node's and the engine's non-test code may not name.
const FORBIDDEN: &[&str] = &[
    "Instant::now",
    "SystemTime::now",
    "OsRng",
    "SystemRandom",
    "thread::spawn",
    "thread::Builder",
    "UdpSocket",
    "TcpStream",
    "TcpListener",
];

/// Every `.rs` file under `dir`, without `tests` directories and without the files the
/// directory's `mod.rs` declares test-only (`#[cfg(test)] mod name;`).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let test_only = fs::read_to_string(dir.join("mod.rs"))
        .map(|m| test_only_children(&m))
        .unwrap_or_default();
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if path.is_dir() {
            if name != "tests" && !test_only.contains(&name) {
                sources(&path, out);
            }
        } else if let Some(stem) = name.strip_suffix(".rs")
            && !test_only.iter().any(|t| t == stem)
        {
            out.push(path);
        }
    }
}

/// The children a `mod.rs` declares behind `#[cfg(test)]` (`#[cfg(test)] mod sim;`, also
/// `pub` or `pub(crate)`).
fn test_only_children(module: &str) -> Vec<String> {
    let lines: Vec<&str> = module.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| {
            let rest = w[1]
                .strip_prefix("pub(crate) ")
                .or_else(|| w[1].strip_prefix("pub "))
                .unwrap_or(w[1]);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_owned())
        })
        .collect()
}

/// `source` without its comments and its inline `#[cfg(test)]` items (a test module or a
/// test-only fn, up to its closing brace), one kept line per line.
fn code(source: &str) -> Vec<(usize, String)> {
    let mut kept = Vec::new();
    let mut skip_next_item = false;
    let mut depth: i64 = 0;
    let mut in_test_item = false;
    for (n, line) in source.lines().enumerate() {
        let trimmed = line.trim();
        if in_test_item {
            depth += braces(trimmed);
            if depth <= 0 {
                in_test_item = false;
            }
            continue;
        }
        if trimmed == "#[cfg(test)]" {
            skip_next_item = true;
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        if skip_next_item {
            if trimmed.starts_with("#[") {
                continue;
            }
            skip_next_item = false;
            depth = braces(trimmed);
            // An item that ends on its own line (`mod sim;`, `use ...;`) is skipped alone.
            in_test_item = depth > 0;
            continue;
        }
        kept.push((n + 1, line.to_owned()));
    }
    kept
}

/// Opening minus closing braces on a line.
fn braces(line: &str) -> i64 {
    let open = line.matches('{').count();
    let close = line.matches('}').count();
    i64::try_from(open).unwrap_or(i64::MAX) - i64::try_from(close).unwrap_or(i64::MAX)
}

/// Each forbidden name in `source`'s code, as `file:line: name`.
fn findings(file: &str, source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in code(source) {
        for name in FORBIDDEN {
            if line.contains(name) {
                found.push(format!("{file}:{n}: {name}"));
            }
        }
    }
    found
}

#[test]
fn the_node_and_the_engine_read_no_clock_no_os_randomness_and_own_no_thread_or_socket() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/reach");
    let mut files = Vec::new();
    sources(&root.join("node"), &mut files);
    sources(&root.join("engine"), &mut files);
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
        .collect();
    for expected in ["node/mod.rs", "node/route.rs", "engine/mod.rs"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not read: {names:?}"
        );
    }
    for unexpected in [
        "engine/sim.rs",
        "engine/sim_nat.rs",
        "node/tests/base.rs",
        "node/sim/mod.rs",
    ] {
        assert!(
            !names.iter().any(|n| n == unexpected),
            "{unexpected} is test code"
        );
    }
    let mut found = Vec::new();
    for (file, name) in files.iter().zip(&names) {
        let source = fs::read_to_string(file).unwrap_or_else(|e| panic!("{name}: {e}"));
        found.extend(findings(name, &source));
    }
    assert!(found.is_empty(), "sans-IO code names I/O: {found:#?}");
}

#[test]
fn the_scan_sees_a_clock_read_in_code_and_not_in_a_test_module_or_a_comment() {
    let source = "\
use std::time::Instant;
// Instant::now is read by the runtime.
fn due() -> Instant {
    Instant::now()
}
#[cfg(test)]
fn seeded() -> Box<dyn RngCore> {
    Box::new(OsRng)
}
#[cfg(test)]
mod tests {
    fn start() {
        let _ = std::thread::spawn(|| {});
    }
}
fn send(s: &std::net::UdpSocket) {}
";
    assert_eq!(
        findings("x.rs", source),
        ["x.rs:4: Instant::now", "x.rs:16: UdpSocket"]
    );
    assert_eq!(
        test_only_children(
            "mod a;\n#[cfg(test)]\nmod sim;\n#[cfg(test)]\npub(crate) mod sim_nat;\n#[cfg(test)]\nmod tests;\n"
        ),
        ["sim", "sim_nat", "tests"]
    );
}
