//! What this crate reads from /proc: process identity (pid plus start time, so a recycled pid
//! is never mistaken for the machine), children, PID-namespace pids, and mount points. Parsers
//! are plain functions over text, unit-tested.

use std::path::{Path, PathBuf};

/// A process, identified across pid reuse by its start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcId {
    pub pid: i32,
    pub start_time: u64,
}

impl ProcId {
    /// The process with this pid as it is now, if it exists.
    pub fn of(pid: i32) -> Option<ProcId> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, start_time) = parse_stat(&stat)?;
        Some(ProcId { pid, start_time })
    }

    /// True while this very process exists and has not exited (a zombie has exited).
    pub fn alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        matches!(parse_stat(&stat), Some((state, start)) if start == self.start_time && state != 'Z' && state != 'X')
    }
}

/// The state letter and the start time (field 22) of a `/proc/<pid>/stat` line. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // `rest` starts at field 3 (state); field 22 is index 19.
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// The pids of `NSpid:` in a `/proc/<pid>/status` text: the pid in each PID namespace from the
/// process's outermost to its own.
pub fn parse_nspid(status: &str) -> Vec<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The direct children of `pid`, over all its threads.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<i32> = tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The init process of a PID namespace below `root`: the nearest descendant (children first,
/// then grandchildren, three levels at most) whose own namespace calls it pid 1.
pub fn find_ns_init(root: i32) -> Option<ProcId> {
    let mut level = vec![root];
    for _ in 0..3 {
        let next: Vec<i32> = level.iter().flat_map(|p| children(*p)).collect();
        for pid in &next {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let ns = parse_nspid(&status);
            if ns.len() >= 2 && ns.last() == Some(&1) {
                return ProcId::of(*pid);
            }
        }
        level = next;
    }
    None
}

/// Mount points (field 5) of a `/proc/<pid>/mountinfo` text, with the kernel's octal escapes
/// (`\040` for a space...) decoded.
pub fn parse_mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_octal(p)))
        .collect()
}

fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount points of this process's mount namespace.
pub fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mount_points(&t))
        .unwrap_or_default()
}

/// Mount points at or below `dir`, deepest first (the order to unmount them in).
pub fn mounts_under(points: &[PathBuf], dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = points
        .iter()
        .filter(|p| p.starts_with(dir))
        .cloned()
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "4242 (systemd (the) init) S 4240 4242 4242 0 -1 4194560 1234 0 0 0 \
                    5 6 0 0 20 0 1 0 987654 23456789 3000 18446744073709551615";
        assert_eq!(parse_stat(stat), Some(('S', 987654)));
        assert_eq!(parse_stat("12 (x) Z 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn nspid_lists_the_pid_in_each_namespace() {
        let status = "Name:\tsystemd\nPid:\t13319\nNSpid:\t13319\t1\nNSpgid:\t13319\t1\n";
        assert_eq!(parse_nspid(status), vec![13319, 1]);
        assert_eq!(parse_nspid("Name:\tbash\nNSpid:\t77\n"), vec![77]);
        assert!(parse_nspid("Name:\tbash\n").is_empty());
    }

    #[test]
    fn mount_points_decode_escapes() {
        let info = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
95 22 0:50 / /var/lib/plexsphere/machines/a/merged rw,relatime - overlay overlay rw,lowerdir=/x
96 22 0:51 / /srv/with\\040space rw - tmpfs tmpfs rw
";
        let points = parse_mount_points(info);
        assert_eq!(
            points,
            vec![
                PathBuf::from("/"),
                PathBuf::from("/var/lib/plexsphere/machines/a/merged"),
                PathBuf::from("/srv/with space"),
            ]
        );
    }

    #[test]
    fn mounts_under_a_dir_come_deepest_first_and_respect_component_boundaries() {
        let points = vec![
            PathBuf::from("/"),
            PathBuf::from("/m/a/merged"),
            PathBuf::from("/m/a/merged/proc"),
            PathBuf::from("/m/ab/merged"),
        ];
        assert_eq!(
            mounts_under(&points, Path::new("/m/a")),
            vec![
                PathBuf::from("/m/a/merged/proc"),
                PathBuf::from("/m/a/merged")
            ]
        );
        assert!(mounts_under(&points, Path::new("/m/c")).is_empty());
    }

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_not() {
        let me = ProcId::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        let other = ProcId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!other.alive());
    }

    #[test]
    fn a_reaped_child_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcId::of(child.id() as i32);
        child.wait().unwrap();
        if let Some(id) = id {
            assert!(!id.alive());
        }
    }
}
