//! Text that comes from a request (a field name, serde's error message quoting it) made safe to
//! put in a log line, an event or a result: no control characters, bounded length.

/// The most bytes [`sanitize_reason`] returns, its truncation marker included.
pub const MAX_REASON_BYTES: usize = 512;

/// Appended to a reason that was cut at [`MAX_REASON_BYTES`].
pub const TRUNCATED: &str = "…(truncated)";

/// Escapes control characters (`\n` becomes `\\n`, ESC `\\u{1b}`), line and paragraph
/// separators and bidirectional overrides, and cuts the result to at most
/// [`MAX_REASON_BYTES`] bytes on a character boundary, ending in [`TRUNCATED`] when cut.
pub fn sanitize_reason(text: &str) -> String {
    let budget = MAX_REASON_BYTES - TRUNCATED.len();
    let mut out = String::with_capacity(text.len().min(MAX_REASON_BYTES));
    // The length of `out` when it last ended within `budget`, on a whole escape.
    let mut fits = 0;
    for ch in text.chars() {
        if needs_escape(ch) {
            out.extend(ch.escape_default());
        } else {
            out.push(ch);
        }
        if out.len() <= budget {
            fits = out.len();
        } else if out.len() > MAX_REASON_BYTES {
            out.truncate(fits);
            out.push_str(TRUNCATED);
            break;
        }
    }
    out
}

fn needs_escape(ch: char) -> bool {
    ch.is_control()
        || matches!(ch, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            sanitize_reason("a\nb\x1b[31mc\td\u{202e}é"),
            "a\\nb\\u{1b}[31mc\\td\\u{202e}é"
        );
        assert_eq!(sanitize_reason("plain `text`"), "plain `text`");
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_with_a_marker() {
        let exact = "x".repeat(MAX_REASON_BYTES);
        assert_eq!(sanitize_reason(&exact), exact);
        let long = "é".repeat(MAX_REASON_BYTES);
        let cut = sanitize_reason(&long);
        assert!(cut.len() <= MAX_REASON_BYTES, "{}", cut.len());
        assert!(cut.ends_with(TRUNCATED));
        assert!(cut.trim_end_matches(TRUNCATED).chars().all(|c| c == 'é'));
        // An escape is kept whole or not at all.
        let escapes = "\n".repeat(MAX_REASON_BYTES);
        let cut = sanitize_reason(&escapes);
        assert!(cut.len() <= MAX_REASON_BYTES);
        assert_eq!(cut.trim_end_matches(TRUNCATED).replace("\\n", ""), "");
    }
}
