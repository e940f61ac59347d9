//! Paged lookup answers: where the next page of a lookup's answer is (a URL at a JSON pointer
//! of the answer, the `Link` header's `rel="next"` target, or the next number of a query
//! parameter), and the checks that keep every page on the lookup's own scheme, host and port:
//! a page is asked with the target's headers, which must never go elsewhere.

use http::header::{HeaderMap, LINK};
use http::Uri;
use serde_json::Value;

use crate::template::dot_segment;

/// How a lookup finds its next page (`lookup.paging`, validated).
pub(super) struct Paging {
    pub(super) style: Style,
    /// The most pages one lookup reads.
    pub(super) max_pages: u32,
}

/// Where the next page is.
pub(super) enum Style {
    /// Its URL is at this JSON pointer of the answer (`null`, absent or `""`: none).
    NextPointer(String),
    /// Its URL is the target of the `Link` header's `rel="next"` link (none: no such link).
    Link,
    /// Pages are numbered by the query parameter `name`, from `first`; a page with no record,
    /// or fewer than `size`, is the last.
    PageParam {
        name: String,
        first: u64,
        size: Option<usize>,
    },
}

/// One page as read: what finding the next one needs.
pub(super) struct Page<'a> {
    /// Its number in the order read, from 1.
    pub(super) number: u32,
    /// The URL it was asked at.
    pub(super) url: &'a str,
    pub(super) doc: &'a Value,
    pub(super) headers: &'a HeaderMap,
    /// How many records it held, matching or not.
    pub(super) records: usize,
}

impl Paging {
    /// The URL of the first page of the lookup asked at `url`: `url` itself, or with the page
    /// parameter at its first number.
    pub(super) fn first(&self, url: &str) -> String {
        match &self.style {
            Style::PageParam { name, first, .. } => with_param(url, name, *first),
            Style::NextPointer(_) | Style::Link => url.to_string(),
        }
    }

    /// The URL of the page after `page` of the lookup asked at `url`, or `None` when `page` is
    /// the last. `Err`: why the answer cannot be read further (its next page is past
    /// `max_pages`, or its URL cannot be used), for the caller to name the target and page.
    pub(super) fn next(&self, url: &str, page: &Page<'_>) -> Result<Option<String>, String> {
        let next = match &self.style {
            Style::NextPointer(pointer) => match page.doc.pointer(pointer) {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if s.is_empty() => None,
                Some(Value::String(s)) => Some(resolve(page.url, s)?),
                Some(other) => {
                    return Err(format!(
                        "the next page's URL at `{pointer}` (lookup.paging.next_pointer) is {}, not a string",
                        kind(other)
                    ))
                }
            },
            Style::Link => match next_link(page.headers)? {
                Some(target) => Some(resolve(page.url, &target)?),
                None => None,
            },
            Style::PageParam { name, first, size } => {
                if page.records == 0 || size.is_some_and(|size| page.records < size) {
                    None
                } else {
                    let number = first
                        .checked_add(u64::from(page.number))
                        .ok_or("the next page's number is out of range")?;
                    Some(with_param(url, name, number))
                }
            }
        };
        if next.is_some() && page.number >= self.max_pages {
            return Err(format!(
                "the answer has more pages than lookup.paging.max_pages ({}); records past them are unread, raise max_pages",
                self.max_pages
            ));
        }
        Ok(next)
    }
}

/// `url` with the query parameter `name` set to `number` (added: the lookup URL has no such
/// parameter, checked when the target is loaded).
fn with_param(url: &str, name: &str, number: u64) -> String {
    let url = url.split('#').next().unwrap_or_default();
    let separator = match url.split_once('?') {
        None => "?",
        Some((_, query)) if query.is_empty() || query.ends_with('&') => "",
        Some(_) => "&",
    };
    format!("{url}{separator}{name}={number}")
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most this many characters of a remote-supplied URL are quoted in an error.
const SHOWN: usize = 200;

fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// A next page's URL as the remote wrote it (`reference`) resolved against the URL of the page
/// that gave it (`base`, absolute) as RFC 3986 §5.2 does: an absolute URL, `//host/path`,
/// `/path`, `?query` or a relative path, its `.` and `..` segments removed and its fragment
/// dropped. It must be on `base`'s scheme, host and port, without user info.
fn resolve(base: &str, reference: &str) -> Result<String, String> {
    let unusable = |why: &str| format!("the next page's URL `{}` {why}", shown(reference));
    let base_uri: Uri = base
        .parse()
        .map_err(|e| unusable(&format!("follows a page whose URL is invalid: {e}")))?;
    let (Some(scheme), Some(authority)) = (base_uri.scheme_str(), base_uri.authority()) else {
        return Err(unusable("follows a page whose URL is not absolute"));
    };
    let reference = reference.split('#').next().unwrap_or_default();
    let target = if has_scheme(reference) {
        reference.to_string()
    } else if let Some(rest) = reference.strip_prefix("//") {
        format!("{scheme}://{rest}")
    } else {
        let path = base_uri.path();
        let tail = if reference.is_empty() {
            base_uri
                .path_and_query()
                .map_or(path, |p| p.as_str())
                .to_string()
        } else if reference.starts_with('/') {
            reference.to_string()
        } else if reference.starts_with('?') {
            format!("{path}{reference}")
        } else {
            let directory = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            format!("{directory}{reference}")
        };
        format!("{scheme}://{authority}{tail}")
    };
    let uri: Uri = target
        .parse()
        .map_err(|e| unusable(&format!("is not a URL: {e}")))?;
    if !same_origin(&base_uri, &uri) {
        return Err(unusable(&format!(
            "is not on the lookup's scheme, host and port ({scheme}://{authority}): the target's headers go nowhere else"
        )));
    }
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let next = format!(
        "{scheme}://{authority}{}{query}",
        remove_dot_segments(uri.path())
    );
    if let Some(segment) = dot_segment(&next) {
        return Err(unusable(&format!(
            "has the path segment `{segment}`, which addresses another resource"
        )));
    }
    Ok(next)
}

/// Whether a URI reference starts with a scheme (`scheme:`, RFC 3986 §3.1).
fn has_scheme(reference: &str) -> bool {
    let end = reference.find([':', '/', '?']).unwrap_or(reference.len());
    reference[end..].starts_with(':')
        && reference[..end].starts_with(|c: char| c.is_ascii_alphabetic())
        && reference[..end]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Same scheme, host and port (a missing port is the scheme's), and no user info.
fn same_origin(base: &Uri, other: &Uri) -> bool {
    let port = |uri: &Uri| {
        let default = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("https") => 443,
            _ => 80,
        };
        uri.port_u16().unwrap_or(default)
    };
    let (Some(a), Some(b)) = (base.authority(), other.authority()) else {
        return false;
    };
    !b.as_str().contains('@')
        && base.scheme_str().map(str::to_ascii_lowercase)
            == other.scheme_str().map(str::to_ascii_lowercase)
        && a.host().eq_ignore_ascii_case(b.host())
        && port(base) == port(other)
}

/// A path with its `.` and `..` segments applied (RFC 3986 §5.2.4), for a path starting
/// with `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." => {}
            ".." => {
                out.pop();
            }
            s => {
                out.push(s);
                continue;
            }
        }
        // `/a/.` and `/a/b/..` end with a slash: the directory.
        if last {
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}

/// The target of the `rel="next"` link of the `Link` header fields (RFC 8288 §3: any number
/// of fields, each a comma-separated list of `<URI-reference>` with `;`-separated parameters,
/// values tokens or quoted strings; `rel` is a space-separated list of relation types compared
/// without case, and only its first occurrence in a link counts). `None`: no next link.
/// Two different next targets are an error: which one leads on is unknown.
fn next_link(headers: &HeaderMap) -> Result<Option<String>, String> {
    let mut found: Option<String> = None;
    for value in headers.get_all(LINK) {
        let text = value
            .to_str()
            .map_err(|_| "a `Link` header is not ASCII text".to_string())?;
        for (target, rel) in links(text)? {
            let next = rel
                .split_ascii_whitespace()
                .any(|r| r.eq_ignore_ascii_case("next"));
            match &found {
                Some(other) if next && *other != target => {
                    return Err(format!(
                        "the `Link` header names two next pages, `{}` and `{}`",
                        shown(other),
                        shown(&target)
                    ))
                }
                _ if next => found = Some(target),
                _ => {}
            }
        }
    }
    Ok(found)
}

/// The links of one `Link` field value: each target with its `rel` (empty when it has none).
fn links(text: &str) -> Result<Vec<(String, String)>, String> {
    let bad = || {
        format!(
            "a `Link` header is not a list of `<URL>; rel=\"...\"` links: `{}`",
            shown(text)
        )
    };
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return Ok(out);
        }
        let inner = rest.strip_prefix('<').ok_or_else(bad)?;
        let end = inner.find('>').ok_or_else(bad)?;
        let target = inner[..end].trim().to_string();
        rest = skip_ows(&inner[end + 1..]);
        let mut rel: Option<String> = None;
        while let Some(param) = rest.strip_prefix(';') {
            let param = skip_ows(param);
            let name_end = param
                .find(['=', ';', ',', ' ', '\t'])
                .unwrap_or(param.len());
            let name = &param[..name_end];
            rest = skip_ows(&param[name_end..]);
            let mut value = String::new();
            if let Some(after) = rest.strip_prefix('=') {
                let (read, after) = param_value(skip_ows(after)).ok_or_else(bad)?;
                (value, rest) = (read, skip_ows(after));
            }
            if name.eq_ignore_ascii_case("rel") && rel.is_none() {
                rel = Some(value);
            }
        }
        if !(rest.is_empty() || rest.starts_with(',')) {
            return Err(bad());
        }
        out.push((target, rel.unwrap_or_default()));
    }
}

/// `text` without its leading spaces and tabs.
fn skip_ows(text: &str) -> &str {
    text.trim_start_matches([' ', '\t'])
}

/// A parameter's value, a token or a quoted string (unescaped), and the text after it;
/// `None` for a quoted string that does not end.
fn param_value(text: &str) -> Option<(String, &str)> {
    let Some(quoted) = text.strip_prefix('"') else {
        let end = text.find([';', ',', ' ', '\t']).unwrap_or(text.len());
        return Some((text[..end].to_string(), &text[end..]));
    };
    let mut value = String::new();
    let mut chars = quoted.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &quoted[i + 1..])),
            '\\' => value.push(chars.next()?.1),
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use http::header::{HeaderMap, HeaderValue, LINK};

    use super::*;

    fn link_headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(LINK, HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    fn next_of(values: &[&str]) -> Result<Option<String>, String> {
        next_link(&link_headers(values))
    }

    #[test]
    fn the_next_link_is_found_among_links_params_and_fields() {
        let next = |values: &[&str]| next_of(values).unwrap();
        assert_eq!(
            next(&[r#"<http://h/p?page=2>; rel="next""#]).as_deref(),
            Some("http://h/p?page=2")
        );
        // Unquoted, upper case, in a list of relation types, after other links and params.
        assert_eq!(next(&["</a>; rel=NEXT"]).as_deref(), Some("/a"));
        assert_eq!(
            next(&[r#"<http://h/p?page=1>; rel="first", <http://h/p?ids=1,2;x>; title="a, b; c"; rel="next last""#])
                .as_deref(),
            Some("http://h/p?ids=1,2;x")
        );
        // A quoted string with an escaped quote; spaces around `;` and `=`.
        assert_eq!(
            next(&[r#"<b>; title="say \"next\""  ;  rel = "next""#]).as_deref(),
            Some("b")
        );
        // The next link in a second field.
        assert_eq!(
            next(&[r#"<p1>; rel="prev""#, r#"<p3>; rel="next""#]).as_deref(),
            Some("p3")
        );
        // Only the first `rel` of a link counts; `next` elsewhere is no relation.
        assert_eq!(next(&[r#"<x>; rel="prev"; rel="next""#]), None);
        assert_eq!(next(&[r#"<x>; title="next"; rel="nextpage""#]), None);
        assert_eq!(next(&[]), None);
        // The same next target twice is one.
        assert_eq!(
            next(&[r#"<n>; rel="next""#, r#"<n>; rel=next"#]).as_deref(),
            Some("n")
        );
    }

    #[test]
    fn a_link_header_that_cannot_be_read_or_names_two_next_pages_is_an_error() {
        for bad in [
            "http://h/p; rel=next",
            "<http://h/p; rel=next",
            r#"<a>; rel="next"#,
            r#"<a> rel="next""#,
        ] {
            let err = next_of(&[bad]).unwrap_err();
            assert!(err.contains("is not a list of"), "{bad}: {err}");
        }
        let err = next_of(&[r#"<a>; rel="next", <b>; rel="next""#]).unwrap_err();
        assert!(err.contains("two next pages"), "{err}");
    }

    #[test]
    fn next_urls_resolve_against_the_page_and_stay_on_its_origin() {
        let base = "http://127.0.0.1:8600/v1/records?reference=t&page=1";
        let ok = |reference: &str| resolve(base, reference).unwrap();
        assert_eq!(
            ok("http://127.0.0.1:8600/v1/records?page=2"),
            "http://127.0.0.1:8600/v1/records?page=2"
        );
        assert_eq!(ok("HTTP://127.0.0.1:8600/x"), "http://127.0.0.1:8600/x");
        assert_eq!(ok("//127.0.0.1:8600/x"), "http://127.0.0.1:8600/x");
        assert_eq!(
            ok("/other?cursor=a%2Fb"),
            "http://127.0.0.1:8600/other?cursor=a%2Fb"
        );
        assert_eq!(ok("?page=2"), "http://127.0.0.1:8600/v1/records?page=2");
        assert_eq!(
            ok("more?page=2#top"),
            "http://127.0.0.1:8600/v1/more?page=2"
        );
        assert_eq!(ok("../v2/records"), "http://127.0.0.1:8600/v2/records");
        assert_eq!(ok("./"), "http://127.0.0.1:8600/v1/");
        assert_eq!(ok(""), base);
        // The default port is the scheme's.
        assert_eq!(
            resolve("https://api.example/r", "https://API.example:443/r?p=2").unwrap(),
            "https://api.example/r?p=2"
        );
        for elsewhere in [
            "http://127.0.0.1:8601/v1/records?page=2",
            "http://127.0.0.2:8600/v1/records?page=2",
            "https://127.0.0.1:8600/v1/records?page=2",
            "//evil.example/records",
            "http://user:pw@127.0.0.1:8600/records",
            "ftp://127.0.0.1:8600/records",
        ] {
            let err = resolve(base, elsewhere).unwrap_err();
            assert!(
                err.contains("is not on the lookup's scheme, host and port"),
                "{elsewhere}: {err}"
            );
        }
        assert!(resolve(base, "/a b").unwrap_err().contains("is not a URL"));
        assert!(resolve(base, "/x/%2e%2e/y")
            .unwrap_err()
            .contains("path segment"));
    }

    #[test]
    fn dot_segments_are_removed_as_rfc_3986_says() {
        for (path, expected) in [
            ("/a/b/c/./../../g", "/a/g"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("/../x", "/x"),
            ("/a//b", "/a//b"),
            ("/", "/"),
        ] {
            assert_eq!(remove_dot_segments(path), expected, "{path}");
        }
    }

    #[test]
    fn page_numbers_are_added_to_the_query() {
        assert_eq!(with_param("http://h/r", "page", 1), "http://h/r?page=1");
        assert_eq!(
            with_param("http://h/r?a=1", "page", 2),
            "http://h/r?a=1&page=2"
        );
        assert_eq!(with_param("http://h/r?", "p", 0), "http://h/r?p=0");
        assert_eq!(with_param("http://h/r?a=1&", "p", 3), "http://h/r?a=1&p=3");
    }
}
