//! Canonical JSON: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings escaped as serde_json writes them, and every other token as written.
//!
//! The canonical text of a payload is what its hash covers and what is sent, so it must keep
//! each number token exactly as the producer wrote it (`1E2`, `100.00`, `-0`,
//! `12345678901234567890123`). A parsed `serde_json::Value` cannot: serde_json writes an
//! exponent as `e` with its sign. So a payload that arrives as JSON text is canonicalized from
//! that text ([`canonical_text`]); a payload built in code, from its value ([`canonical_json`]).
//! For text without exponents both give the same bytes.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write as _;
use std::ops::Range;

use serde_json::Value;

/// The canonical text of `value`. Independent of how `serde_json` orders maps, so the hash
/// never depends on a feature flag.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

/// The canonical text of the JSON document `text`, with number tokens copied verbatim.
/// `None` when `text` is not one JSON value (callers pass text serde_json has accepted).
pub fn canonical_text(text: &str) -> Option<String> {
    let mut scan = Scan::new(text);
    let mut out = String::with_capacity(text.len());
    scan.value(&mut out)?;
    scan.end()?;
    Some(out)
}

/// Why a text has no canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotCanonical {
    /// It is not one JSON value of the expected kind.
    Invalid,
    /// An object in it has this key twice (a parsed value would keep one silently).
    DuplicateKey(String),
}

/// The canonical text of member `key` of the JSON object `text` (`None` when it has no such
/// member); refused when `text` is not one JSON object or an object in it, at any depth, has a
/// key twice.
pub fn object_member(text: &str, key: &str) -> Result<Option<String>, NotCanonical> {
    scan_object(text, |members, values| {
        let i = members.binary_search_by(|(k, _)| k.as_bytes().cmp(key.as_bytes()));
        i.ok().map(|i| values[members[i].1.clone()].to_string())
    })
}

/// The canonical text of the JSON object `text` with `fields` set as string members (replacing
/// any of the same name; of a name given twice, the last). Refused as [`object_member`] is.
pub fn object_with_fields<'f>(
    text: &str,
    fields: impl IntoIterator<Item = (&'f str, String)>,
) -> Result<String, NotCanonical> {
    let mut fields: Vec<(&str, String)> = fields.into_iter().collect();
    // Stable: of two fields with one name the later stays last, and is the one kept.
    fields.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut literals = String::new();
    let mut set: Vec<(&str, Range<usize>)> = Vec::with_capacity(fields.len());
    for (i, (key, value)) in fields.iter().enumerate() {
        if fields.get(i + 1).is_some_and(|next| next.0 == *key) {
            continue;
        }
        let start = literals.len();
        write_string(value, &mut literals);
        set.push((key, start..literals.len()));
    }
    scan_object(text, |members, values| {
        let mut out = String::with_capacity(text.len() + literals.len() + 16 * set.len());
        let (mut old, mut new) = (members.iter().peekable(), set.iter().peekable());
        let merged = std::iter::from_fn(|| {
            let set_next = match (old.peek(), new.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((o, _)), Some((n, _))) => match o.as_bytes().cmp(n.as_bytes()) {
                    Ordering::Less => false,
                    Ordering::Greater => true,
                    Ordering::Equal => {
                        old.next(); // replaced by the field
                        true
                    }
                },
            };
            Some(if set_next {
                let (k, r) = new.next()?;
                (*k, &literals[r.clone()])
            } else {
                let (k, r) = old.next()?;
                (k.as_ref(), &values[r.clone()])
            })
        });
        write_members(merged, &mut out);
        out
    })
}

/// Scans the JSON object `text` and hands `f` its members in the byte order of their keys,
/// each with the range of its canonical value in the second argument.
fn scan_object<R>(
    text: &str,
    f: impl FnOnce(&[(Cow<str>, Range<usize>)], &str) -> R,
) -> Result<R, NotCanonical> {
    let mut scan = Scan::new(text);
    let mut values = String::new();
    let members = scan.members(&mut values).and_then(|members| {
        scan.end()?;
        Some(members)
    });
    match members {
        Some(members) => Ok(f(&members, &values)),
        None => Err(match scan.duplicate {
            Some(key) => NotCanonical::DuplicateKey(key),
            None => NotCanonical::Invalid,
        }),
    }
}

/// An object of these members, given in the byte order of their keys (values already
/// canonical text).
fn write_members<'k>(members: impl Iterator<Item = (&'k str, &'k str)>, out: &mut String) {
    out.push('{');
    for (i, (key, value)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        out.push_str(value);
    }
    out.push('}');
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(v, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    if !s.bytes().any(needs_escape) {
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    // serde_json's string escaping is deterministic; serializing a &str cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// The bytes serde_json writes escaped in a string: `"`, `\` and the control characters.
fn needs_escape(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// A cursor over JSON text that writes its canonical form.
struct Scan<'a> {
    text: &'a str,
    at: usize,
    /// The key an object had twice, when that is why the scan failed.
    duplicate: Option<String>,
}

impl<'a> Scan<'a> {
    fn new(text: &'a str) -> Scan<'a> {
        Scan {
            text,
            at: 0,
            duplicate: None,
        }
    }

    fn skip_whitespace(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len();
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.text.as_bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    fn value(&mut self, out: &mut String) -> Option<()> {
        match self.peek()? {
            b'{' => {
                let mut values = String::new();
                let members = self.members(&mut values)?;
                let members = members.iter();
                write_members(members.map(|(k, r)| (k.as_ref(), &values[r.clone()])), out);
            }
            b'[' => {
                self.at += 1;
                out.push('[');
                if self.eat(b']').is_none() {
                    loop {
                        self.value(out)?;
                        if self.eat(b',').is_some() {
                            out.push(',');
                        } else {
                            self.eat(b']')?;
                            break;
                        }
                    }
                }
                out.push(']');
            }
            b'"' => write_string(&self.string()?, out),
            _ => out.push_str(self.token()?),
        }
        Some(())
    }

    /// An object's members in the byte order of their keys: each key, and where its value's
    /// canonical text is in `values` (written there one after the other). A key written twice
    /// is refused (found by sorting, so an object of many keys costs n log n, not n²).
    fn members(&mut self, values: &mut String) -> Option<Vec<(Cow<'a, str>, Range<usize>)>> {
        self.eat(b'{')?;
        let mut members = Vec::new();
        if self.eat(b'}').is_none() {
            loop {
                self.peek()?;
                let key = self.string()?;
                self.eat(b':')?;
                let start = values.len();
                self.value(values)?;
                members.push((key, start..values.len()));
                if self.eat(b',').is_none() {
                    self.eat(b'}')?;
                    break;
                }
            }
        }
        members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        if let Some(pair) = members.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            self.duplicate = Some(pair[0].0.to_string());
            return None;
        }
        Some(members)
    }

    /// A string literal, decoded (borrowed when it has no escapes).
    fn string(&mut self) -> Option<Cow<'a, str>> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.at) != Some(&b'"') {
            return None;
        }
        let mut end = self.at + 1;
        loop {
            match bytes.get(end)? {
                b'\\' => end += 2,
                b'"' => break,
                _ => end += 1,
            }
        }
        let literal = &self.text[self.at..=end];
        self.at = end + 1;
        let inner = &literal[1..literal.len() - 1];
        if !inner.bytes().any(needs_escape) {
            return Some(Cow::Borrowed(inner));
        }
        // Escapes to decode, or a control character serde_json refuses.
        serde_json::from_str(literal).ok().map(Cow::Owned)
    }

    /// A number or a literal (`true`, `false`, `null`), as written.
    fn token(&mut self) -> Option<&'a str> {
        let rest = &self.text[self.at..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .unwrap_or(rest.len());
        let token = &rest[..len];
        let valid = matches!(token, "true" | "false" | "null")
            || serde_json::from_str::<serde_json::Number>(token).is_ok();
        self.at += len;
        valid.then_some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_without_escapes_are_copied_and_others_written_as_serde_json_does() {
        for s in [
            "plain",
            "é ü 漢 😀",
            "a/b",
            "\u{7f}",
            "q\"uote",
            "back\\slash",
            "tab\t",
            "\u{1}",
        ] {
            let mut out = String::new();
            write_string(s, &mut out);
            assert_eq!(out, serde_json::to_string(s).unwrap(), "{s:?}");
            assert_eq!(canonical_text(&out).as_deref(), Some(out.as_str()), "{s:?}");
        }
        // Escapes that need not be are decoded and written as serde_json writes them.
        assert_eq!(canonical_text(r#""\u0041\/""#).unwrap(), r#""A/""#);
        // A raw control character is not JSON.
        assert_eq!(canonical_text("\"a\u{1}\""), None);
    }

    #[test]
    fn text_and_value_agree_except_for_exponents() {
        let text = r#" { "b" : [1, 2.50, -0, {"z": null, "a": true}], "a\u00e9": "x\"y", "c": {} ,"d":[]} "#;
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(canonical_text(text).unwrap(), canonical_json(&value));
        assert_eq!(
            canonical_text(text).unwrap(),
            r#"{"aé":"x\"y","b":[1,2.50,-0,{"a":true,"z":null}],"c":{},"d":[]}"#
        );
        // The exponent as written, where a parsed value writes `e` and a sign.
        assert_eq!(
            canonical_text(r#"{"n": [1E2, 1e-2]}"#).unwrap(),
            r#"{"n":[1E2,1e-2]}"#
        );
        let value: Value = serde_json::from_str(r#"{"n": [1E2, 1e-2]}"#).unwrap();
        assert_eq!(canonical_json(&value), r#"{"n":[1e+2,1e-2]}"#);
    }

    #[test]
    fn invalid_text_has_no_canonical_form() {
        for text in [
            "",
            "{",
            "{\"a\" 1}",
            "[1,]",
            "tru",
            "1 2",
            "{\"a\":1,\"a\":2}",
            "01x",
            "\"open",
        ] {
            assert_eq!(canonical_text(text), None, "{text:?}");
        }
    }

    #[test]
    fn many_keys_are_sorted_and_a_repeated_one_is_found() {
        let keys: Vec<String> = (0..5_000).rev().map(|i| format!("k{i:05}")).collect();
        let object = |keys: &[String]| {
            let members: Vec<String> = keys.iter().map(|k| format!("\"{k}\": 1")).collect();
            format!("{{{}}}", members.join(", "))
        };
        let mut sorted = keys.clone();
        sorted.sort();
        let expected: Vec<String> = sorted.iter().map(|k| format!("\"{k}\":1")).collect();
        assert_eq!(
            canonical_text(&object(&keys)).unwrap(),
            format!("{{{}}}", expected.join(","))
        );
        let mut repeated = keys.clone();
        repeated.push("k02500".into());
        assert_eq!(
            object_member(&object(&repeated), "k00000"),
            Err(NotCanonical::DuplicateKey("k02500".into()))
        );
    }

    #[test]
    fn a_member_is_read_and_fields_are_set_in_key_order() {
        let text = r#"{"ref": "old", "amount": 1E2, "z": {"b": 1, "a": [2]}}"#;
        assert_eq!(object_member(text, "amount"), Ok(Some("1E2".into())));
        assert_eq!(
            object_member(text, "z"),
            Ok(Some(r#"{"a":[2],"b":1}"#.into()))
        );
        assert_eq!(object_member(text, "missing"), Ok(None));
        let set = |fields: &[(&'static str, &str)]| {
            object_with_fields(text, fields.iter().map(|(k, v)| (*k, v.to_string())))
        };
        assert_eq!(
            set(&[("ref", "new"), ("a", "x\"y"), ("m", "1"), ("~", "")]).unwrap(),
            r#"{"a":"x\"y","amount":1E2,"m":"1","ref":"new","z":{"a":[2],"b":1},"~":""}"#
        );
        assert_eq!(
            set(&[("m", "first"), ("m", "last")]).unwrap(),
            r#"{"amount":1E2,"m":"last","ref":"old","z":{"a":[2],"b":1}}"#
        );
        assert_eq!(
            object_with_fields("{}", [("k", "v".to_string())]).unwrap(),
            r#"{"k":"v"}"#
        );
        assert_eq!(set(&[]).unwrap(), canonical_text(text).unwrap());
        assert_eq!(object_member("[1]", "a"), Err(NotCanonical::Invalid));
        assert_eq!(object_with_fields("{} x", []), Err(NotCanonical::Invalid));
        assert_eq!(
            object_member(r#"{"a": {"b": [{"k": 1, "\u006b": 2}]}}"#, "a"),
            Err(NotCanonical::DuplicateKey("k".into()))
        );
    }
}
