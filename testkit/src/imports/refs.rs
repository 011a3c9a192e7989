//! The paths one source file names: its `use` declarations (with their
//! trees spread out, their visibility and the name they bind) and the paths
//! written in its code, each with the inline module it stands in.

use super::tokens::{Spanned, Token, lex};

/// One path a file names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    /// The inline modules (`mod tests { … }`) the path stands in, outermost
    /// first; empty at the file's top level.
    pub(crate) inline: Vec<String>,
    /// The path's segments as written (`super`, `record`, `WINDOW`).
    pub(crate) segments: Vec<String>,
    pub(crate) line: usize,
    pub(crate) kind: Kind,
}

/// How a file names a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// In code.
    Path,
    /// In a `use` declaration.
    Use {
        /// `pub use` (of any visibility): the file re-exports what it names.
        public: bool,
        /// The name bound: the alias or the last segment; `None` for a glob.
        binds: Option<String>,
    },
}

/// The paths `source` names.
pub(crate) fn references(source: &str) -> Vec<Reference> {
    let tokens = lex(source);
    Walker {
        tokens: &tokens,
        pos: 0,
        found: Vec::new(),
    }
    .walk()
}

struct Walker<'a> {
    tokens: &'a [Spanned],
    pos: usize,
    found: Vec<Reference>,
}

impl Walker<'_> {
    fn token(&self, at: usize) -> Option<&Token> {
        self.tokens.get(at).map(|t| &t.token)
    }

    fn ident(&self, at: usize) -> Option<&str> {
        match self.token(at) {
            Some(Token::Ident(s)) => Some(s),
            _ => None,
        }
    }

    fn walk(mut self) -> Vec<Reference> {
        // Inline modules open, with the brace depth inside each.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        while self.pos < self.tokens.len() {
            let line = self.tokens[self.pos].line;
            match self.token(self.pos) {
                Some(Token::Punct('{')) => {
                    depth += 1;
                    self.pos += 1;
                }
                Some(Token::Punct('}')) => {
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                    self.pos += 1;
                }
                Some(Token::Ident(k)) if k == "mod" => {
                    if let (Some(name), Some(Token::Punct('{'))) =
                        (self.ident(self.pos + 1), self.token(self.pos + 2))
                    {
                        inline.push((name.to_owned(), depth + 1));
                    }
                    self.pos += 1;
                }
                Some(Token::Ident(k)) if k == "use" && self.starts_item() => {
                    let public = self.is_public_use();
                    self.pos += 1;
                    let names: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                    let mut leaves = Vec::new();
                    self.use_tree(Vec::new(), &mut leaves);
                    for (segments, binds) in leaves {
                        self.found.push(Reference {
                            inline: names.clone(),
                            segments,
                            line,
                            kind: Kind::Use { public, binds },
                        });
                    }
                }
                Some(Token::Ident(_)) if self.starts_path() => {
                    let mut segments = Vec::new();
                    while let Some(segment) = self.ident(self.pos) {
                        segments.push(segment.to_owned());
                        if self.token(self.pos + 1) != Some(&Token::PathSep)
                            || self.ident(self.pos + 2).is_none()
                        {
                            break;
                        }
                        self.pos += 2;
                    }
                    self.pos += 1;
                    self.found.push(Reference {
                        inline: inline.iter().map(|(n, _)| n.clone()).collect(),
                        segments,
                        line,
                        kind: Kind::Path,
                    });
                }
                _ => self.pos += 1,
            }
        }
        self.found
    }

    /// Whether the `use` at the cursor begins a declaration (and is not, say,
    /// a field called `use` in a macro).
    fn starts_item(&self) -> bool {
        self.pos == 0
            || matches!(
                self.token(self.pos - 1),
                Some(Token::Punct(';' | '{' | '}' | ']' | ')')) | Some(Token::Ident(_))
            )
    }

    /// Whether the `use` at the cursor is preceded by `pub` or `pub(…)`.
    fn is_public_use(&self) -> bool {
        match self.pos.checked_sub(1).and_then(|p| self.token(p)) {
            Some(Token::Ident(p)) => p == "pub",
            Some(Token::Punct(')')) => {
                let mut at = self.pos - 1;
                while at > 0 && self.token(at) != Some(&Token::Punct('(')) {
                    at -= 1;
                }
                at > 0 && self.ident(at - 1) == Some("pub")
            }
            _ => false,
        }
    }

    /// Whether the identifier at the cursor starts a path of two or more
    /// segments (`a::b`), not continues one.
    fn starts_path(&self) -> bool {
        let continues = self
            .pos
            .checked_sub(1)
            .is_some_and(|p| self.token(p) == Some(&Token::PathSep));
        !continues && self.token(self.pos + 1) == Some(&Token::PathSep)
    }

    /// Spreads the use tree at the cursor into its leaves under `prefix`:
    /// (full path, name bound), consuming up to and including its end
    /// (`,`, `}` of the enclosing group is left for the caller, `;` eaten).
    fn use_tree(
        &mut self,
        mut prefix: Vec<String>,
        leaves: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        if self.token(self.pos) == Some(&Token::PathSep) {
            self.pos += 1; // a leading `::`: an external crate
        }
        loop {
            match self.token(self.pos) {
                Some(Token::Ident(s)) => {
                    prefix.push(s.clone());
                    self.pos += 1;
                    if self.token(self.pos) == Some(&Token::PathSep) {
                        self.pos += 1;
                        continue;
                    }
                    let mut binds = prefix.last().cloned();
                    if self.ident(self.pos) == Some("as") {
                        binds = self.ident(self.pos + 1).map(str::to_owned);
                        self.pos += 2;
                    }
                    // `use a::b::self` binds `b`.
                    if prefix.last().is_some_and(|s| s == "self") && prefix.len() > 1 {
                        prefix.pop();
                        if binds.as_deref() == Some("self") {
                            binds = prefix.last().cloned();
                        }
                    }
                    leaves.push((prefix, binds));
                    break;
                }
                Some(Token::Punct('*')) => {
                    self.pos += 1;
                    leaves.push((prefix, None));
                    break;
                }
                Some(Token::Punct('{')) => {
                    self.pos += 1;
                    loop {
                        match self.token(self.pos) {
                            Some(Token::Punct('}')) | None => {
                                self.pos += 1;
                                break;
                            }
                            Some(Token::Punct(',')) => self.pos += 1,
                            _ => {
                                let before = self.pos;
                                self.use_tree(prefix.clone(), leaves);
                                if self.pos == before {
                                    self.pos += 1;
                                }
                            }
                        }
                    }
                    break;
                }
                _ => break,
            }
        }
        if self.token(self.pos) == Some(&Token::Punct(';')) {
            self.pos += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(source: &str) -> Vec<String> {
        references(source)
            .into_iter()
            .map(|r| {
                let kind = match r.kind {
                    Kind::Path => "path".to_owned(),
                    Kind::Use { public, binds } => format!(
                        "{}use as {}",
                        if public { "pub " } else { "" },
                        binds.as_deref().unwrap_or("*")
                    ),
                };
                let inline = r.inline.join("::");
                format!("{}|{}|{}|{kind}", r.line, inline, r.segments.join("::"))
            })
            .collect()
    }

    #[test]
    fn use_trees_spread_into_their_leaves() {
        let found = summary(
            "pub use record::{Recorded, WINDOW as W};\nuse crate::{a::{self, b::*}, c};\npub(crate) use super::x::Y;\n",
        );
        assert_eq!(
            found,
            [
                "1||record::Recorded|pub use as Recorded",
                "1||record::WINDOW|pub use as W",
                "2||crate::a|use as a",
                "2||crate::a::b|use as *",
                "2||crate::c|use as c",
                "3||super::x::Y|pub use as Y",
            ]
        );
    }

    #[test]
    fn paths_in_code_and_inline_modules() {
        let found = summary(
            "fn f() { crate::a::g(); let v: Vec<u8> = Vec::new(); }\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { store::Store::open(); }\n}\nfn h() { self::k(); }\n",
        );
        assert_eq!(
            found,
            [
                "1||crate::a::g|path",
                "1||Vec::new|path",
                "4|tests|super|use as *",
                "5|tests|store::Store::open|path",
                "7||self::k|path",
            ]
        );
    }
}
