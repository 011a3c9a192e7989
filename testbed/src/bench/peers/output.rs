//! What the peers' tools print, made short enough for an error message:
//! colours stripped, the last few hundred characters kept.

use super::TAIL_CHARS;

/// `text` without ANSI escape sequences (sockperf colours its output).
pub(super) fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The last [`TAIL_CHARS`] characters of `text`, without colours and
/// surrounding blank space.
pub(super) fn tail(text: &str) -> String {
    let text = strip_ansi(text);
    let text = text.trim();
    let skip = text.chars().count().saturating_sub(TAIL_CHARS);
    let tail: String = text.chars().skip(skip).collect();
    if skip > 0 { format!("…{tail}") } else { tail }
}
