//! Bearer-token credentials, as the admin endpoint's operators and the front door's callers
//! hold them: the service keeps each token's SHA-256 only, compares without stopping at the
//! first differing byte, and names a credential by its id, the first 16 hex digits of that
//! hash (knowing an id does not help to guess its token: tokens from the environment are at
//! least [`MIN_TOKEN_BYTES`] long).

use sha2::{Digest, Sha256};

use crate::error::ConfigError;

/// Shortest token accepted from the environment, in bytes.
pub const MIN_TOKEN_BYTES: usize = 32;

/// The SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The id of the credential whose token hashes to `hash`.
pub fn credential_id(hash: &[u8; 32]) -> String {
    hash[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The id of a token's credential (for tools and tests).
pub fn token_credential_id(token: &str) -> String {
    credential_id(&sha256(token.as_bytes()))
}

/// Compares without stopping at the first difference, so timing does not reveal a secret.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in any case).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// The hashes of one holder's tokens: `tokens_env` (variables read through `env`, each at
/// least [`MIN_TOKEN_BYTES`]) and `token_sha256` (64 hex digits each); one or two in all,
/// unless `optional`. `field` is the holder's configuration path (`admin.operators.ana`).
pub fn token_hashes(
    field: &str,
    tokens_env: &[String],
    token_sha256: &[String],
    optional: bool,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<[u8; 32]>, ConfigError> {
    let given = tokens_env.len() + token_sha256.len();
    if given > 2 || (given == 0 && !optional) {
        return Err(ConfigError::field(
            format!("{field}.tokens_env"),
            "with token_sha256, names no token or more than two: give one, or two while a token is rotated",
        ));
    }
    let mut hashes = Vec::new();
    for (i, var) in tokens_env.iter().enumerate() {
        let token = env(var).unwrap_or_default();
        if token.len() < MIN_TOKEN_BYTES {
            return Err(ConfigError::field(
                format!("{field}.tokens_env[{i}]"),
                format!("environment variable {var} is unset or shorter than {MIN_TOKEN_BYTES} bytes; set it to the token (e.g. 32 random bytes, hex-encoded)"),
            ));
        }
        hashes.push(sha256(token.as_bytes()));
    }
    for (i, hex) in token_sha256.iter().enumerate() {
        let hash = parse_sha256(hex).ok_or_else(|| {
            ConfigError::field(
                format!("{field}.token_sha256[{i}]"),
                "is not a SHA-256 digest: 64 hex digits (`printf %s TOKEN | sha256sum`)",
            )
        })?;
        hashes.push(hash);
    }
    Ok(hashes)
}

/// A SHA-256 digest written as 64 hex digits, optionally in pairs separated by `:` (as
/// `openssl x509 -fingerprint -sha256` prints a certificate's).
pub fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex: String = hex.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_read_with_or_without_colons_and_the_bearer_scheme_in_any_case() {
        let digest = sha256(b"x");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let colons: Vec<String> = digest.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(parse_sha256(&hex), Some(digest));
        assert_eq!(parse_sha256(&colons.join(":")), Some(digest));
        assert_eq!(parse_sha256(&hex[1..]), None);
        assert_eq!(bearer_token("bearer  abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
    }
}
