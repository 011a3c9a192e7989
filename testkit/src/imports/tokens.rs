//! A small Rust lexer for the import scan: identifiers and the punctuation
//! that shapes paths, with the contents of strings, chars and comments
//! (doc comments too) skipped.

/// One token of Rust source, as far as paths are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// An identifier or keyword (`r#` stripped).
    Ident(String),
    /// `::`.
    PathSep,
    /// Any other punctuation character (`{`, `}`, `;`, `,`, `*`, `$`, `(`, …).
    Punct(char),
}

/// A token and the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spanned {
    pub(crate) token: Token,
    pub(crate) line: usize,
}

/// The tokens of `source`.
pub(crate) fn lex(source: &str) -> Vec<Spanned> {
    let mut lexer = Lexer {
        chars: source.chars().collect(),
        pos: 0,
        line: 1,
        tokens: Vec::new(),
    };
    lexer.run();
    lexer.tokens
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    line: usize,
    tokens: Vec<Spanned>,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.get(self.pos).copied()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn push(&mut self, token: Token, line: usize) {
        self.tokens.push(Spanned { token, line });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                '/' if self.peek(1) == Some('/') => self.line_comment(),
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => self.string(),
                'r' | 'b' | 'c' if self.raw_or_byte_string_ahead() => self.prefixed_string(),
                'b' if self.peek(1) == Some('\'') => {
                    self.bump();
                    self.char_or_lifetime();
                }
                '\'' => self.char_or_lifetime(),
                ':' if self.peek(1) == Some(':') => {
                    self.bump();
                    self.bump();
                    self.push(Token::PathSep, line);
                }
                c if c == '_' || c.is_alphabetic() => {
                    let ident = self.ident();
                    self.push(Token::Ident(ident), line);
                }
                c if c.is_ascii_digit() => {
                    while self
                        .peek(0)
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
                    {
                        // `1..2` is a range, not a number with two points.
                        if self.peek(0) == Some('.') && self.peek(1) == Some('.') {
                            break;
                        }
                        self.bump();
                    }
                }
                c if c.is_whitespace() => {
                    self.bump();
                }
                c => {
                    self.bump();
                    self.push(Token::Punct(c), line);
                }
            }
        }
    }

    fn ident(&mut self) -> String {
        if self.peek(0) == Some('r') && self.peek(1) == Some('#') {
            self.pos += 2;
        }
        let mut ident = String::new();
        while let Some(c) = self.peek(0).filter(|c| *c == '_' || c.is_alphanumeric()) {
            ident.push(c);
            self.pos += 1;
        }
        ident
    }

    fn line_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.bump();
        }
    }

    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while self.peek(0).is_some() {
            if self.peek(0) == Some('/') && self.peek(1) == Some('*') {
                depth += 1;
                self.bump();
                self.bump();
            } else if self.peek(0) == Some('*') && self.peek(1) == Some('/') {
                depth -= 1;
                self.bump();
                self.bump();
                if depth == 0 {
                    break;
                }
            } else {
                self.bump();
            }
        }
    }

    fn raw_or_byte_string_ahead(&self) -> bool {
        let mut ahead = 0;
        if matches!(self.peek(0), Some('b' | 'c')) {
            ahead += 1;
        }
        if self.peek(ahead) == Some('r') {
            ahead += 1;
            while self.peek(ahead) == Some('#') {
                ahead += 1;
            }
        }
        ahead > 0 && self.peek(ahead) == Some('"')
    }

    fn prefixed_string(&mut self) {
        if matches!(self.peek(0), Some('b' | 'c')) {
            self.bump();
        }
        if self.peek(0) != Some('r') {
            self.string();
            return;
        }
        self.bump();
        let mut hashes = 0;
        while self.peek(0) == Some('#') {
            hashes += 1;
            self.bump();
        }
        self.bump(); // the opening quote
        while let Some(c) = self.bump() {
            if c == '"' && (0..hashes).all(|k| self.peek(k) == Some('#')) {
                for _ in 0..hashes {
                    self.bump();
                }
                return;
            }
        }
    }

    fn string(&mut self) {
        self.bump(); // the opening quote
        while let Some(c) = self.bump() {
            match c {
                '\\' => {
                    self.bump();
                }
                '"' => return,
                _ => {}
            }
        }
    }

    /// `'x'`, `'\n'` and `'\u{..}'` are chars; `'a` and `'static` lifetimes.
    fn char_or_lifetime(&mut self) {
        self.bump(); // the quote
        if self.peek(0) == Some('\\') {
            self.bump();
            self.bump(); // the escaped character
            while self.bump().is_some_and(|c| c != '\'') {}
        } else if self.peek(1) == Some('\'') {
            self.bump();
            self.bump();
        } else {
            // A lifetime or label: its name lexes as an identifier that no
            // path starts with.
            let line = self.line;
            let name = self.ident();
            self.push(Token::Punct('\''), line);
            self.push(Token::Ident(name), line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(source: &str) -> Vec<String> {
        lex(source)
            .into_iter()
            .filter_map(|t| match t.token {
                Token::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn strings_chars_and_comments_hide_their_contents() {
        let source = r####"
            let a = "crate::x::y"; // crate::z
            let b = r#"super::q "quoted""#; /* self::w /* nested */ */
            let c = b'{'; let d = '\''; let e: &'static str = br"x";
        "####;
        let ids = idents(source);
        for hidden in ["x", "y", "z", "q", "w", "nested", "quoted"] {
            assert!(!ids.contains(&hidden.to_owned()), "{hidden} in {ids:?}");
        }
        assert!(ids.contains(&"static".to_owned()));
    }

    #[test]
    fn doc_comments_name_nothing() {
        let ids = idents(
            "/// See [`super::record::WINDOW`].
//! [`crate::limits`]
/** self::x */ fn a() {}
",
        );
        assert_eq!(ids, ["fn", "a"]);
    }

    #[test]
    fn lines_count_across_strings_and_comments() {
        let tokens = lex("\"a\nb\"\n/* c\n */ x");
        assert_eq!(tokens.last().map(|t| t.line), Some(4));
    }
}
