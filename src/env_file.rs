//! Laravel and Rails `.env` files (`--env-file`): `NAME=value` lines as
//! vlucas/phpdotenv and the dotenv gem read them, with `${VAR}` and `$VAR`
//! expansion, bounded. A `.env` holds every secret of an app, so an error
//! names the line and the variable, never a value: not the broken line's,
//! not the lines after it. The file, each expanded value and all values
//! together have a size bound, so a file of references doubling each
//! other (2^n bytes in n lines) is a configuration error, not an abort.
//!
//! The format: blank lines and `#` comments; `[export ]NAME=value` with
//! NAME of `[A-Za-z_][A-Za-z0-9_.]*`; a value is
//! - `'single quoted'`: taken as written (may span lines);
//! - `"double quoted"`: `\n` `\r` `\t` `\"` `\\` `\$` escapes, expansion
//!   (may span lines);
//! - unquoted: to the end of the line or a ` #` comment, trimmed, with
//!   expansion; quotes inside it are plain characters (`Bob's Shop`).
//!
//! A reference takes the process environment's value first (the
//! environment wins over the file, as with both loaders), then the file's
//! first definition above it, else nothing.

use std::collections::HashMap;
use std::fmt;

/// Largest `.env` read (bytes). Laravel's are a few KiB.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Largest value after expansion (bytes): room for a PEM key or a JSON
/// credential inline.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
/// Largest sum of every value after expansion (bytes).
pub const MAX_TOTAL_BYTES: usize = 4 << 20;

/// One variable the file sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Var {
    pub name: String,
    pub value: String,
}

/// Why a file cannot be read: the line (1-based) a variable starts on,
/// the variable when the line got as far as `NAME=`, and what is wrong.
/// Nothing of any value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub line: usize,
    pub name: Option<String>,
    pub problem: Problem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    NotUtf8,
    /// The line is not `NAME=value` (its text is not shown: a wrapped
    /// line of a value may be a secret).
    NotAssignment,
    UnclosedQuote(char),
    AfterQuote,
    UnclosedReference,
    BadReference,
    Nul,
    ValueTooLong,
    TotalTooLong,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line)?;
        if let Some(name) = &self.name {
            write!(f, "{name}: ")?;
        }
        match self.problem {
            Problem::NotUtf8 => write!(f, "not UTF-8 text"),
            Problem::NotAssignment => write!(f, "not a NAME=value line"),
            Problem::UnclosedQuote(q) => write!(f, "the value's opening {q} is never closed"),
            Problem::AfterQuote => write!(
                f,
                "text after the value's closing quote (quote the whole value, or none of it)"
            ),
            Problem::UnclosedReference => write!(f, "a ${{ in the value is never closed"),
            Problem::BadReference => write!(f, "a ${{...}} in the value holds no variable name"),
            Problem::Nul => write!(f, "the value holds a NUL byte"),
            Problem::ValueTooLong => write!(
                f,
                "the value is over {MAX_VALUE_BYTES} bytes once ${{VAR}} references are expanded"
            ),
            Problem::TotalTooLong => write!(
                f,
                "the values together are over {MAX_TOTAL_BYTES} bytes once ${{VAR}} references are expanded"
            ),
        }
    }
}

/// Parse `bytes` (at most [`MAX_FILE_BYTES`]: the caller reads no more),
/// expanding references with `env` (the process environment) first.
pub fn parse(bytes: &[u8], env: impl Fn(&str) -> Option<String>) -> Result<Vec<Var>, Error> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error {
        line: 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count(),
        name: None,
        problem: Problem::NotUtf8,
    })?;
    Parser {
        rest: text,
        line: 1,
        seen: HashMap::new(),
        total: 0,
        env: &env,
    }
    .run()
}

struct Parser<'a, E> {
    rest: &'a str,
    line: usize,
    /// The file's first definition of each name (what the loader sets).
    seen: HashMap<String, String>,
    total: usize,
    env: &'a E,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

impl<'a, E: Fn(&str) -> Option<String>> Parser<'a, E> {
    fn run(mut self) -> Result<Vec<Var>, Error> {
        let mut out = Vec::new();
        loop {
            self.skip_blank();
            let Some(c) = self.rest.chars().next() else {
                return Ok(out);
            };
            match c {
                '\n' => self.newline(),
                '#' => self.skip_line(),
                _ => {
                    let line = self.line;
                    let var = self.assignment()?;
                    self.total += var.value.len();
                    if self.total > MAX_TOTAL_BYTES {
                        return Err(Error {
                            line,
                            name: Some(var.name),
                            problem: Problem::TotalTooLong,
                        });
                    }
                    self.seen
                        .entry(var.name.clone())
                        .or_insert_with(|| var.value.clone());
                    out.push(var);
                }
            }
        }
    }

    fn error(&self, name: Option<&str>, problem: Problem) -> Error {
        Error {
            line: self.line,
            name: name.map(str::to_owned),
            problem,
        }
    }

    /// Spaces, tabs and carriage returns (CRLF files).
    fn skip_blank(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t', '\r']);
    }

    fn newline(&mut self) {
        self.rest = &self.rest[1..];
        self.line += 1;
    }

    /// To the end of the line, not past its newline.
    fn skip_line(&mut self) {
        let end = self.rest.find('\n').unwrap_or(self.rest.len());
        self.rest = &self.rest[end..];
    }

    /// `[A-Za-z_][A-Za-z0-9_.]*` at the start of the rest, taken.
    fn name(&mut self) -> Option<&'a str> {
        if !self.rest.starts_with(is_name_start) {
            return None;
        }
        let end = self
            .rest
            .find(|c: char| !(is_name_char(c) || c == '.'))
            .unwrap_or(self.rest.len());
        let (name, rest) = self.rest.split_at(end);
        self.rest = rest;
        Some(name)
    }

    /// `[export ]NAME=value` and the rest of its (last) line.
    fn assignment(&mut self) -> Result<Var, Error> {
        let not_assignment = |p: &Self| p.error(None, Problem::NotAssignment);
        let mut name = self.name().ok_or_else(|| not_assignment(self))?;
        if name == "export" && self.rest.starts_with([' ', '\t']) {
            self.skip_blank();
            name = self.name().ok_or_else(|| not_assignment(self))?;
        }
        let name = name.to_owned();
        self.skip_blank();
        self.rest = self
            .rest
            .strip_prefix('=')
            .ok_or_else(|| not_assignment(self))?;
        self.rest = self.rest.trim_start_matches([' ', '\t']);
        let start = self.line;
        let fail = |problem| Error {
            line: start,
            name: Some(name.clone()),
            problem,
        };
        let value = match self.rest.chars().next() {
            Some(q @ ('"' | '\'')) => {
                let raw = self
                    .quoted(q)
                    .ok_or_else(|| fail(Problem::UnclosedQuote(q)))?;
                // Only a comment may follow the closing quote.
                self.skip_blank();
                if !(self.rest.is_empty() || self.rest.starts_with(['\n', '#'])) {
                    return Err(fail(Problem::AfterQuote));
                }
                self.skip_line();
                if q == '"' {
                    self.expand(raw, true).map_err(fail)?
                } else {
                    bounded(raw).map_err(fail)?
                }
            }
            _ => {
                let end = self.rest.find('\n').unwrap_or(self.rest.len());
                let (line, rest) = self.rest.split_at(end);
                self.rest = rest;
                // A comment starts at a `#` after a blank (or first).
                let cut = line
                    .char_indices()
                    .find(|&(i, c)| c == '#' && (i == 0 || line[..i].ends_with([' ', '\t'])))
                    .map_or(line.len(), |(i, _)| i);
                self.expand(line[..cut].trim_end(), false).map_err(fail)?
            }
        };
        if value.contains('\0') {
            return Err(fail(Problem::Nul));
        }
        Ok(Var { name, value })
    }

    /// The text between quote `q` at the start of the rest and its closing
    /// one (for `"`, one after a backslash does not close), taken with
    /// both quotes; lines inside are counted. `None`: never closed.
    fn quoted(&mut self, q: char) -> Option<&'a str> {
        let body: &'a str = &self.rest[1..];
        let mut escaped = false;
        let end = body.char_indices().find_map(|(i, c)| {
            let closes = c == q && !escaped;
            escaped = q == '"' && c == '\\' && !escaped;
            closes.then_some(i)
        })?;
        let raw = &body[..end];
        self.line += raw.matches('\n').count();
        self.rest = &body[end + 1..];
        Some(raw)
    }

    /// `raw` with its references expanded and (in double quotes) its
    /// escapes read; unquoted, only `\$` is an escape.
    fn expand(&self, raw: &str, escapes: bool) -> Result<String, Problem> {
        let mut out = String::new();
        let push = |out: &mut String, s: &str| {
            if out.len() + s.len() > MAX_VALUE_BYTES {
                return Err(Problem::ValueTooLong);
            }
            out.push_str(s);
            Ok(())
        };
        let mut chars = raw.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    let next = chars.peek().map(|&(_, n)| n);
                    let unescaped = match next {
                        Some('$') => Some('$'),
                        Some(n) if escapes => match n {
                            'n' => Some('\n'),
                            'r' => Some('\r'),
                            't' => Some('\t'),
                            '"' | '\\' => Some(n),
                            _ => None,
                        },
                        _ => None,
                    };
                    match unescaped {
                        Some(u) => {
                            chars.next();
                            push(&mut out, u.encode_utf8(&mut [0; 4]))?;
                        }
                        None => push(&mut out, "\\")?,
                    }
                }
                '$' => {
                    let after = &raw[i + 1..];
                    let (name, len) = if let Some(inner) = after.strip_prefix('{') {
                        let close = inner.find('}').ok_or(Problem::UnclosedReference)?;
                        let name = &inner[..close];
                        if !(name.starts_with(is_name_start) && name.chars().all(is_name_char)) {
                            return Err(Problem::BadReference);
                        }
                        (name, close + 2)
                    } else if after.starts_with(is_name_start) {
                        let end = after
                            .find(|c: char| !is_name_char(c))
                            .unwrap_or(after.len());
                        (&after[..end], end)
                    } else {
                        push(&mut out, "$")?;
                        continue;
                    };
                    // The characters of the reference are ASCII.
                    for _ in 0..len {
                        chars.next();
                    }
                    match (self.env)(name) {
                        Some(v) => push(&mut out, &v)?,
                        None => push(&mut out, self.seen.get(name).map_or("", String::as_str))?,
                    }
                }
                c => push(&mut out, c.encode_utf8(&mut [0; 4]))?,
            }
        }
        Ok(out)
    }
}

/// A value taken as written, within [`MAX_VALUE_BYTES`].
fn bounded(raw: &str) -> Result<String, Problem> {
    if raw.len() > MAX_VALUE_BYTES {
        return Err(Problem::ValueTooLong);
    }
    Ok(raw.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(text: &str) -> Result<Vec<(String, String)>, Error> {
        let env = |n: &str| (n == "FROM_ENV").then(|| "env".to_owned());
        Ok(parse(text.as_bytes(), env)?
            .into_iter()
            .map(|v| (v.name, v.value))
            .collect())
    }

    fn one(text: &str) -> String {
        let v = vars(text).unwrap();
        assert_eq!(v.len(), 1, "{text}: {v:?}");
        v[0].1.clone()
    }

    #[test]
    fn spellings() {
        assert_eq!(one("A=1"), "1");
        assert_eq!(one("  export   A = 1  \r\n"), "1");
        assert_eq!(one("export=x"), "x");
        assert_eq!(one("A=Bob's Shop # a comment"), "Bob's Shop");
        assert_eq!(one("A=a#b"), "a#b");
        assert_eq!(one("A=#b"), "");
        assert_eq!(one("A="), "");
        assert_eq!(one("A=\"x # y\" # z"), "x # y");
        assert_eq!(one("A='lit $B \\n'"), "lit $B \\n");
        assert_eq!(one(r#"A="q\"uo\\te\n\t\$B\x""#), "q\"uo\\te\n\t$B\\x");
        assert_eq!(one("A=\"one\ntwo\""), "one\ntwo");
        assert_eq!(one("A='one\ntwo'"), "one\ntwo");
        assert_eq!(one("A=c:\\path\\$x"), "c:\\path$x");
        assert_eq!(one("A=$ 5 and $"), "$ 5 and $");
        assert_eq!(one("A.B_1=x"), "x");
        let v = vars("# c\n\nA=1\nB=${A}-$A-${FROM_ENV}-$NONE-x\nA=2\nC=$A").unwrap();
        assert_eq!(v[1].1, "1-1-env--x");
        // The first definition is the one in force (the loader sets it).
        assert_eq!(v[3].1, "1");
        assert_eq!(one("A=${FROM_ENV}_x$FROM_ENV.y"), "env_xenv.y");
    }

    fn error(text: &str) -> Error {
        vars(text).unwrap_err()
    }

    #[test]
    fn errors_name_line_and_variable_only() {
        let e = error("A=1\n\nB=\"open\nC=secret\n");
        assert_eq!(
            (e.line, e.name.as_deref(), e.problem),
            (3, Some("B"), Problem::UnclosedQuote('"'))
        );
        assert_eq!(
            e.to_string(),
            "line 3: B: the value's opening \" is never closed"
        );
        // Errors after a value spanning lines name the line it starts on.
        let e = error("A=\"x\ny\" z\n");
        assert_eq!((e.line, e.problem), (1, Problem::AfterQuote));
        let e = error("A=1\nB=\"x\ny\"\nsecret words\n");
        assert_eq!(
            (e.line, e.name, e.problem),
            (4, None, Problem::NotAssignment)
        );
        assert_eq!(error("A B=1").problem, Problem::NotAssignment);
        assert_eq!(error("export A").problem, Problem::NotAssignment);
        assert_eq!(error("=1").problem, Problem::NotAssignment);
        assert_eq!(error("A='x'y").problem, Problem::AfterQuote);
        assert_eq!(error("A=${B").problem, Problem::UnclosedReference);
        assert_eq!(error("A=\"${B-1}\"").problem, Problem::BadReference);
        assert_eq!(error("A=${}").problem, Problem::BadReference);
        assert_eq!(error("A='\0'").problem, Problem::Nul);
        let e = parse(b"A=1\nB=\xff\n", |_| None).unwrap_err();
        assert_eq!((e.line, e.problem), (2, Problem::NotUtf8));
        for e in [
            error("A=\"secret"),
            error("A='x'y"),
            error("secret"),
            error("A=${secret"),
        ] {
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }

    proptest::proptest! {
        /// Any text (built from the characters the grammar cares about,
        /// `~` standing for a secret's characters) parses or fails without
        /// a panic, and an error never shows a value: `~` is no name
        /// character, so it can only come from one.
        #[test]
        fn never_panics_nor_shows_a_value(text in "([A-Za-z_.0-9~ \t=#$'\"{}\\\\\r\n]|é|export ){0,120}") {
            if let Err(e) = parse(text.as_bytes(), |n| (n == "E").then(|| "~env~".to_owned())) {
                proptest::prop_assert!(!e.to_string().contains('~'), "{}", e);
            }
        }
    }

    #[test]
    fn expansion_is_bounded() {
        let mut text = String::from("A0=xxx\n");
        for i in 1..60 {
            text.push_str(&format!("A{i}=${{A{}}}${{A{}}}\n", i - 1, i - 1));
        }
        let e = error(&text);
        assert_eq!(
            (e.line, e.name.as_deref(), e.problem),
            (16, Some("A15"), Problem::ValueTooLong)
        );
        assert_eq!(
            one(&format!("A='{}'", "x".repeat(MAX_VALUE_BYTES))).len(),
            MAX_VALUE_BYTES
        );
        assert_eq!(
            error(&format!("A='{}'", "x".repeat(MAX_VALUE_BYTES + 1))).problem,
            Problem::ValueTooLong
        );
        let mut text = format!("B=\"{}\"\n", "b".repeat(MAX_VALUE_BYTES));
        for i in 0..64 {
            text.push_str(&format!("C{i}=$B\n"));
        }
        let e = error(&text);
        assert_eq!((e.line, e.problem), (65, Problem::TotalTooLong));
        // The environment's values are bounded alike.
        let big = "e".repeat(MAX_VALUE_BYTES);
        let e = parse(b"A=x${E}", |_| Some(big.clone())).unwrap_err();
        assert_eq!(e.problem, Problem::ValueTooLong);
    }
}
