//! How deeply a GraphQL document nests, measured before it is parsed.
//!
//! The parser (pest, then async-graphql-parser's tree builder) and every walk
//! over its tree recurse once per level of `{}`, `[]` and `()`: selection
//! sets, list and object values wherever they occur (arguments, directive
//! arguments, variable defaults) and list types. The parser bounds only
//! selection sets, so a 4 KiB argument like `[[[ … ]]]` about 2,000 deep used
//! to overflow a worker thread's stack and abort the whole process. One flat
//! scan over the text, outside strings and comments, bounds every form at
//! once, and it runs before anything recursive sees the document.

/// Deepest nesting of brackets (`{`, `[`, `(` together) a document may have.
/// The schema's own operations need 4; a generous bound that is still a
/// small fraction of a worker's stack.
pub const MAX_NESTING: usize = 64;

/// Whether `src` nests brackets deeper than `max`, counting only brackets
/// the GraphQL lexer would see as punctuators.
///
/// Strings (`"…"`, with escapes, ended by a line terminator as the grammar
/// ends them) and block strings (`"""…"""`, with `\"""`) and `#` comments
/// are skipped. Where this scan and the parser could disagree, the scan
/// counts the bracket: it may refuse a document the parser would have
/// refused anyway, never let a deeper one through.
pub fn exceeds(src: &str, max: usize) -> bool {
    let b = src.as_bytes();
    let mut i = 0;
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'#' => {
                while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
            }
            b'"' if b[i..].starts_with(b"\"\"\"") => {
                i += 3;
                loop {
                    if i >= b.len() {
                        return false;
                    }
                    if b[i..].starts_with(b"\\\"\"\"") {
                        i += 4;
                    } else if b[i..].starts_with(b"\"\"\"") {
                        i += 2; // and the last one below
                        break;
                    } else {
                        i += 1;
                    }
                }
            }
            b'"' => {
                i += 1;
                while i < b.len() {
                    match b[i] {
                        b'\\' => i += 2,
                        b'"' => break,
                        // The grammar ends a string here (as an error): go
                        // on counting from the next line.
                        b'\n' | b'\r' => break,
                        _ => i += 1,
                    }
                }
            }
            b'{' | b'[' | b'(' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::exceeds;

    fn nested(open: &str, close: &str, n: usize) -> String {
        format!("{}\"r\"{}", open.repeat(n), close.repeat(n))
    }

    #[test]
    fn counts_every_bracket_kind_together() {
        assert!(!exceeds(&nested("[", "]", 64), 64));
        assert!(exceeds(&nested("[", "]", 65), 64));
        assert!(exceeds(&nested("{a:", "}", 65), 64));
        assert!(exceeds(&nested("(", ")", 65), 64));
        assert!(exceeds(&nested("{[(", ")]}", 22), 64));
        assert!(!exceeds(&nested("{[(", ")]}", 21), 64));
    }

    #[test]
    fn siblings_do_not_add_up() {
        let wide = "[[]]".repeat(1000);
        let doc = format!("{{ a(x: [{wide}]) }}");
        assert!(!exceeds(&doc, 5));
        assert!(exceeds(&doc, 4));
    }

    #[test]
    fn brackets_in_strings_and_comments_are_not_nesting() {
        let deep = "[".repeat(500);
        assert!(!exceeds(&format!("{{ a(x: \"{deep}\") }}"), 4));
        assert!(!exceeds(&format!("{{ a(x: \"\\\"{deep}\") }}"), 4));
        assert!(!exceeds(
            &format!("{{ a(x: \"\"\"{deep}\\\"\"\"{deep}\"\"\") }}"),
            4
        ));
        assert!(!exceeds(&format!("# {deep}\n{{ a }}"), 4));
    }

    #[test]
    fn what_ends_a_string_for_the_parser_ends_it_here() {
        // An unterminated string stops at the line's end; what follows counts.
        let deep = "[".repeat(100);
        assert!(exceeds(&format!("{{ a(x: \"abc\n{deep}"), 64));
        // A comment ends at a line terminator too.
        assert!(exceeds(&format!("# x\r{deep}"), 64));
        // An escaped quote does not end a string.
        assert!(!exceeds(&format!("\"\\\"{deep}\""), 64));
    }
}
