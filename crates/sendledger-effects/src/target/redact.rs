//! Secret redaction: header values are secrets. They are redacted in `Debug`, and they and
//! their significant parts ([`secret_fragments`]) are removed from any remote-supplied text
//! kept in outcomes, errors and logs (`Target::scrub`).

use std::fmt;

use super::Target;

const REDACTED: &str = "<redacted>";

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(n, _)| (n.as_str(), REDACTED))
            .collect();
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("method", &self.method)
            .field("url", &self.url.source())
            .field("headers", &headers)
            .field("rules", &self.rules)
            .field("idempotency", &self.idempotency)
            .field("propagate_trace", &self.propagate_trace)
            .field("retry", &self.retry)
            .field("lookup", &self.lookup.as_ref().map(|l| l.url.source()))
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Removes configured header values, and their parts a remote may quote, from text that
    /// may echo them.
    pub(super) fn scrub(&self, mut text: String) -> String {
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        text
    }
}

/// Shortest part of a header value that is redacted on its own: shorter ones (a scheme, a
/// version) would blank out ordinary words.
const MIN_SECRET_FRAGMENT: usize = 6;

/// What to redact for one header value: the value itself, the credentials after a scheme
/// (`Bearer abc…` → `abc…`), and each of their tokens (split at whitespace, `,`, `;`, `=` and
/// `"`), parts of at least [`MIN_SECRET_FRAGMENT`] characters only: a remote may quote any of
/// them. The scheme itself (`Bearer`) is no secret.
pub(super) fn secret_fragments(value: &str) -> Vec<String> {
    let value = value.trim();
    let mut out = Vec::new();
    if value.is_empty() {
        return out;
    }
    out.push(value.to_string());
    let credentials = value
        .split_once(char::is_whitespace)
        .map_or(value, |(_scheme, rest)| rest.trim());
    let tokens = credentials.split(|c: char| c.is_whitespace() || ",;=\"".contains(c));
    for part in std::iter::once(credentials).chain(tokens) {
        if part.chars().count() >= MIN_SECRET_FRAGMENT && !out.iter().any(|o| o == part) {
            out.push(part.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_fragments_cover_the_bare_credentials() {
        assert_eq!(
            secret_fragments(" Bearer s3cr3t-token "),
            ["Bearer s3cr3t-token", "s3cr3t-token"]
        );
        assert_eq!(
            secret_fragments("Basic dXNlcjpwYXNzd29yZA=="),
            [
                "Basic dXNlcjpwYXNzd29yZA==",
                "dXNlcjpwYXNzd29yZA==",
                "dXNlcjpwYXNzd29yZA"
            ]
        );
        assert_eq!(
            secret_fragments("Signature keyId=\"abcdef1\",sig=\"xyz\""),
            [
                "Signature keyId=\"abcdef1\",sig=\"xyz\"",
                "keyId=\"abcdef1\",sig=\"xyz\"",
                "abcdef1"
            ]
        );
        // Short parts are not redacted on their own; the whole value always is.
        assert_eq!(secret_fragments("ab cd"), ["ab cd"]);
        assert!(secret_fragments("  ").is_empty());
    }
}
