//! cloud-init's verdict on a machine, parsed from `cloud-init status --long` (22.4 on
//! bookworm; the 23.4+ `degraded` states are understood too).

/// What `cloud-init status --long` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudInitStatus {
    /// cloud-init has not started yet (`not run`).
    NotStarted,
    Running,
    /// Every stage finished without an error.
    Done,
    /// Finished, with recoverable errors (cloud-init 23.4+ `degraded done`).
    Degraded {
        detail: String,
    },
    /// A stage failed; `detail` is cloud-init's own account, e.g.
    /// `('scripts-user', RuntimeError('Runparts: 1 failures (runcmd) in 1 attempted commands'))`.
    Error {
        detail: String,
    },
    /// cloud-init is disabled in this machine.
    Disabled,
    /// A status this crate does not know; the text as cloud-init wrote it.
    Unknown(String),
}

impl CloudInitStatus {
    /// True once cloud-init will not change its verdict in this boot.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            CloudInitStatus::Done
                | CloudInitStatus::Degraded { .. }
                | CloudInitStatus::Error { .. }
                | CloudInitStatus::Disabled
        )
    }
}

impl std::fmt::Display for CloudInitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloudInitStatus::NotStarted => f.write_str("not started"),
            CloudInitStatus::Running => f.write_str("running"),
            CloudInitStatus::Done => f.write_str("done"),
            CloudInitStatus::Degraded { detail } => {
                write!(f, "done with recoverable errors: {detail}")
            }
            CloudInitStatus::Error { detail } => write!(f, "error: {detail}"),
            CloudInitStatus::Disabled => f.write_str("disabled"),
            CloudInitStatus::Unknown(s) => write!(f, "unknown status {s:?}"),
        }
    }
}

/// A known `key: value` line at the top level of the output.
fn top_level_key(line: &str) -> Option<(&str, &str)> {
    if line.starts_with([' ', '\t']) {
        return None;
    }
    let (key, value) = line.split_once(':')?;
    let known = [
        "status",
        "extended_status",
        "boot_status_code",
        "time",
        "last_update",
        "detail",
        "errors",
        "recoverable_errors",
    ];
    known
        .contains(&key.trim())
        .then(|| (key.trim(), value.trim()))
}

/// Parses the output of `cloud-init status --long`; `None` when it has no `status:` line.
pub fn parse_status(text: &str) -> Option<CloudInitStatus> {
    let mut status = None;
    let mut detail: Vec<&str> = Vec::new();
    let mut extra_errors: Vec<&str> = Vec::new();
    let mut section = "";
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some((key, value)) = top_level_key(line) {
            section = key;
            match key {
                "status" => status = Some(value.to_string()),
                "detail" if !value.is_empty() => detail.push(value),
                "errors" | "recoverable_errors" if !matches!(value, "" | "[]" | "{}") => {
                    extra_errors.push(value)
                }
                _ => {}
            }
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        match section {
            "detail" => detail.push(trimmed),
            "errors" | "recoverable_errors" => extra_errors.push(trimmed),
            _ => {}
        }
    }
    let status = status?;
    let detail = detail
        .into_iter()
        .chain(extra_errors)
        .collect::<Vec<_>>()
        .join(" ");
    Some(match status.as_str() {
        "not run" | "not started" => CloudInitStatus::NotStarted,
        "running" | "degraded running" => CloudInitStatus::Running,
        "done" => CloudInitStatus::Done,
        "degraded done" => CloudInitStatus::Degraded { detail },
        "error" => CloudInitStatus::Error { detail },
        "disabled" => CloudInitStatus::Disabled,
        other => CloudInitStatus::Unknown(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Verbatim from cloud-init 22.4 in a bookworm machine booted by this crate.
    const DONE: &str = "status: done\nboot_status_code: enabled-by-generator\n\
        last_update: Mon, 30 Nov 2026 03:55:01 +0000\ndetail:\n\
        DataSourceNoCloud [seed=/var/lib/cloud/seed/nocloud][dsmode=net]\n";
    const ERROR: &str = "status: error\nboot_status_code: enabled-by-generator\n\
        last_update: Mon, 30 Nov 2026 03:55:53 +0000\ndetail:\n\
        ('scripts-user', RuntimeError('Runparts: 1 failures (runcmd) in 1 attempted commands'))\n";
    const RUNNING: &str = "status: running\nboot_status_code: enabled-by-generator\n\
        last_update: Mon, 30 Nov 2026 03:54:10 +0000\ndetail:\n\
        DataSourceNoCloud [seed=/var/lib/cloud/seed/nocloud][dsmode=net]\n";

    #[test]
    fn done_running_and_error_from_22_4() {
        assert_eq!(parse_status(DONE), Some(CloudInitStatus::Done));
        assert_eq!(parse_status(RUNNING), Some(CloudInitStatus::Running));
        let err = parse_status(ERROR).unwrap();
        assert_eq!(
            err,
            CloudInitStatus::Error {
                detail: "('scripts-user', RuntimeError('Runparts: 1 failures (runcmd) in 1 attempted commands'))".into()
            }
        );
        assert!(err.is_final());
        assert!(err.to_string().starts_with("error: ('scripts-user'"));
        assert!(!CloudInitStatus::Running.is_final());
    }

    #[test]
    fn the_newer_shapes_and_short_forms() {
        assert_eq!(
            parse_status("status: not run\n"),
            Some(CloudInitStatus::NotStarted)
        );
        assert_eq!(
            parse_status("status: disabled\n"),
            Some(CloudInitStatus::Disabled)
        );
        let degraded = "status: degraded done\nextended_status: degraded done\n\
            boot_status_code: enabled-by-generator\ndetail: DataSourceNoCloud\n\
            errors: []\nrecoverable_errors:\n  WARNING:\n    - Failed at merging in cloud config\n";
        assert_eq!(
            parse_status(degraded),
            Some(CloudInitStatus::Degraded {
                detail: "DataSourceNoCloud WARNING: - Failed at merging in cloud config".into()
            })
        );
        assert_eq!(
            parse_status("status: weird\n"),
            Some(CloudInitStatus::Unknown("weird".into()))
        );
        assert_eq!(parse_status("Traceback (most recent call last):\n"), None);
        assert_eq!(parse_status(""), None);
    }
}
