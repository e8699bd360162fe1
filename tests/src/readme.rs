//! The README's shell walkthroughs, run as written in a machine: the code blocks between
//! `<!-- {marker}:begin -->` and `<!-- {marker}:end -->`, with only the placeholders filled in
//! and `sudo ` dropped (the machine's shell is root). hand_install.rs runs the hand install
//! with the downloaded binary, packages.rs with the packaged one.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::machines::TestMachine;

/// One fenced block: its language (`sh`, `yaml`) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub lang: String,
    pub text: String,
}

/// The blocks of the README between the `marker` comments, in order.
pub fn blocks(marker: &str) -> Result<Vec<Block>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    blocks_in(&readme, marker)
}

fn blocks_in(readme: &str, marker: &str) -> Result<Vec<Block>> {
    let start = readme
        .find(&format!("<!-- {marker}:begin -->"))
        .with_context(|| format!("the README has no {marker}:begin marker"))?;
    let end = readme
        .find(&format!("<!-- {marker}:end -->"))
        .with_context(|| format!("the README has no {marker}:end marker"))?;
    let mut blocks = Vec::new();
    let mut lines = readme[start..end].lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            blocks.push(Block {
                lang: lang.to_owned(),
                text: body.join("\n") + "\n",
            });
        }
    }
    Ok(blocks)
}

/// Runs one block in `m` with the `(placeholder, value)` pairs filled in: an `sh` block as root
/// in /root with the token "pasted" from /root/pasted-token on stdin; a `yaml` block is
/// appended to /etc/plexd/config.yaml. Returns the text run and what it printed.
pub fn run(m: &TestMachine, block: &Block, fill: &[(&str, &str)]) -> Result<(String, String)> {
    let text = fill
        .iter()
        .fold(block.text.clone(), |t, (from, to)| t.replace(from, to));
    match block.lang.as_str() {
        "sh" => {
            let script = format!(
                "cd /root\nexec </root/pasted-token\n{}",
                text.replace("sudo ", "")
            );
            let out = m.sh(&script)?;
            Ok((text, out))
        }
        "yaml" => {
            let path = m.machine.merged().join("etc/plexd/config.yaml");
            let mut config = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            config.push_str(&text);
            std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
            Ok((text, String::new()))
        }
        other => bail!("a README block of an unexpected kind: {other}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;

    #[test]
    fn blocks_between_the_markers_in_order() {
        let doc = "```sh\nbefore\n```\n<!-- x:begin -->\n1. one\n\n```sh\na\nb\n```\n\n```yaml\nk: v\n```\n<!-- x:end -->\n```sh\nafter\n```\n";
        let b = blocks_in(doc, "x").unwrap();
        assert_eq!(
            b,
            vec![
                Block {
                    lang: "sh".into(),
                    text: "a\nb\n".into()
                },
                Block {
                    lang: "yaml".into(),
                    text: "k: v\n".into()
                },
            ]
        );
        assert!(
            blocks_in(doc, "y")
                .unwrap_err()
                .to_string()
                .contains("y:begin")
        );
    }
}
