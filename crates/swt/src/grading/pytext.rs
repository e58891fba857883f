//! The Python `str` and `re` semantics SWT-bench's parsers rely on, so that the same text gives
//! the same tokens here. Pure.
//!
//! Python's notion of whitespace (`str.isspace`, `str.split()`, `\s`) includes the separators
//! U+001C–U+001F, which Unicode's White_Space (Rust's `char::is_whitespace`) does not; its word
//! characters (`\w`, hence `\b`) are letters, numbers and `_`, without the combining marks Rust's
//! `char::is_alphanumeric` counts as alphabetic.

use regex::Regex;
use std::borrow::Cow;
use std::sync::LazyLock;

/// `str.isspace()` for one character.
pub fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\x1c'..='\x1f'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

static NON_ASCII_WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\A[\p{L}\p{N}]\z").expect("valid pattern"));

/// A word character of Python's `re` (`\w` on `str`): a letter, a number or `_`.
pub fn is_word(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric() || c == '_';
    }
    let mut buf = [0u8; 4];
    c.is_alphanumeric() && NON_ASCII_WORD.is_match(c.encode_utf8(&mut buf))
}

/// `s.split()`: the non-empty runs between Python whitespace.
pub fn split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_space).filter(|w| !w.is_empty())
}

/// `s.strip()`: without Python whitespace at either end.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// The text as Python reads a file in text mode: `\r\n` and a lone `\r` become `\n`.
pub fn universal_newlines(s: &str) -> Cow<'_, str> {
    if !s.contains('\r') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' {
            out.push('\n');
            if chars.peek() == Some(&'\n') {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s.splitlines()`: lines split at `\n`, `\r\n`, `\r`, `\v`, `\f`, U+001C–U+001E, U+0085,
/// U+2028 and U+2029, without their ends; no empty last line for a final break.
pub fn splitlines(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let is_break = matches!(
            c,
            '\n' | '\r' | '\x0b' | '\x0c' | '\x1c'..='\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}'
        );
        if !is_break {
            continue;
        }
        out.push(&s[start..i]);
        let mut end = i + c.len_utf8();
        if c == '\r' && chars.peek().is_some_and(|(_, n)| *n == '\n') {
            chars.next();
            end += 1;
        }
        start = end;
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// A character class matching Python's `\s`, for use inside a `regex` pattern.
pub const SPACE_CLASS: &str = r"[\t-\r\x1c-\x1f \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]";
/// A character class matching Python's `[^\s]`, for use inside a `regex` pattern.
pub const NON_SPACE_CLASS: &str = r"[^\t-\r\x1c-\x1f \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_and_words_are_pythons() {
        let got: Vec<&str> = split(" a\x1cb\u{a0}c\u{3000}\td ").collect();
        assert_eq!(got, vec!["a", "b", "c", "d"]);
        assert!(
            !is_space('\u{200b}'),
            "zero-width space is not whitespace in Python"
        );
        assert!(is_word('é') && is_word('_') && is_word('²') && is_word('७'));
        assert!(
            !is_word('\u{93e}'),
            "a vowel sign is alphabetic to Rust, not a word character to Python"
        );
        assert!(!is_word('-') && !is_word('.'));
    }

    #[test]
    fn splitlines_as_python() {
        assert_eq!(
            splitlines("a\r\nb\x0cc\n\nd\u{2028}"),
            vec!["a", "b", "c", "", "d"]
        );
        assert!(splitlines("").is_empty());
        assert_eq!(splitlines("x"), vec!["x"]);
    }

    #[test]
    fn newlines_as_in_text_mode() {
        assert_eq!(universal_newlines("a\r\nb\rc\n\r\n"), "a\nb\nc\n\n");
        assert!(matches!(universal_newlines("plain\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn classes_match_python_space() {
        let re = Regex::new(&format!("^{SPACE_CLASS}+{NON_SPACE_CLASS}$")).unwrap();
        assert!(re.is_match("\x1c\u{2009} x"));
        assert!(!re.is_match("\u{200b}x"));
    }
}
