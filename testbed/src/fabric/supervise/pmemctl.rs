//! Ready-to-paste `pmemctl` lines for a fabric `testbed up` started.

use std::fmt::Write as _;
use std::path::Path;

/// What the lines need to know of the fabric.
#[derive(Debug, Clone)]
pub struct PmemctlTarget<'a> {
    /// The topology the daemons run (absolute).
    pub config: &'a Path,
    /// The client to act as.
    pub client: &'a str,
    /// The other clients, mentioned as alternatives.
    pub other_clients: &'a [String],
    /// The keys' folder (absolute); `None` when the fabric runs insecure.
    pub secrets: Option<&'a Path>,
    /// The client's network namespace (netns mode).
    pub namespace: Option<&'a str>,
    /// Whether the pool has an allocator (then addresses come from `alloc`).
    pub allocator: bool,
}

/// A few `pmemctl` commands that work against this fabric as pasted, and
/// where `pmemctl` comes from.
pub fn lines(target: &PmemctlTarget<'_>) -> String {
    let mut prefix = String::new();
    if let Some(ns) = target.namespace {
        let _ = write!(prefix, "ip netns exec {} ", quote(ns));
    }
    let _ = write!(
        prefix,
        "pmemctl --config {} --client {}",
        quote(&target.config.display().to_string()),
        quote(target.client)
    );
    if let Some(dir) = target.secrets {
        let _ = write!(prefix, " --secrets {}", quote(&dir.display().to_string()));
    }
    let examples: &[&str] = if target.allocator {
        &["df", "alloc 4KiB --name hello", "open hello", "ls"]
    } else {
        &["map", "write 1TiB hello --persist", "read 1TiB 5", "stat"]
    };
    let mut out = String::new();
    let _ = write!(out, "pmemctl, as client {}", target.client);
    if !target.other_clients.is_empty() {
        let _ = write!(out, " (or --client {})", target.other_clients.join(", "));
    }
    let _ = writeln!(
        out,
        "; `cargo build --release -p pmem-client --bin pmemctl` puts it in target/release/:"
    );
    for example in examples {
        let _ = writeln!(out, "  {prefix} {example}");
    }
    out
}

/// `text` as one shell word: as it is when it needs no quoting, in single
/// quotes otherwise.
fn quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:=,@".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_config_client_and_secrets() {
        let others = vec!["c2".to_owned()];
        let text = lines(&PmemctlTarget {
            config: Path::new("/r/up 1/topology.toml"),
            client: "c1",
            other_clients: &others,
            secrets: Some(Path::new("/r/up 1/secrets")),
            namespace: None,
            allocator: false,
        });
        assert!(
            text.contains(
                "  pmemctl --config '/r/up 1/topology.toml' --client c1 \
                 --secrets '/r/up 1/secrets' write 1TiB hello --persist\n"
            ),
            "{text}"
        );
        assert!(text.contains("(or --client c2)"), "{text}");
    }

    #[test]
    fn netns_and_allocator_change_the_lines() {
        let text = lines(&PmemctlTarget {
            config: Path::new("/r/topology.toml"),
            client: "c1",
            other_clients: &[],
            secrets: None,
            namespace: Some("pf12-c-c1"),
            allocator: true,
        });
        assert!(
            text.contains("  ip netns exec pf12-c-c1 pmemctl --config /r/topology.toml --client c1 alloc 4KiB --name hello\n"),
            "{text}"
        );
        assert!(!text.contains("--secrets"), "{text}");
        assert!(
            !text.contains("write 1TiB"),
            "allocator metadata lives there: {text}"
        );
    }

    #[test]
    fn quoting_keeps_plain_words_plain() {
        assert_eq!(quote("/a/b-c_d.toml"), "/a/b-c_d.toml");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }
}
