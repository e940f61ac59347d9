//! The W3C trace context a task carries (`traceparent`), so that every step of the task, in
//! whichever process or thread it runs and however many restarts later, joins the trace of the
//! request that created it.
//!
//! The ingest copies a request message's `traceparent` Kafka header into the request's
//! metadata under [`TRACEPARENT`]; the metadata is stored with the accepted request inside
//! `TaskAccepted`, so the context survives restarts and needs no new event field. Only the
//! format is checked here (the core has no tracing of its own); the spans are made elsewhere.

use std::fmt;

/// The metadata key (and the Kafka and HTTP header name) of a task's trace context.
pub const TRACEPARENT: &str = "traceparent";

/// A valid W3C `traceparent`: `00-<trace id: 32 hex>-<parent id: 16 hex>-<flags: 2 hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The span the trace context names as the parent of whatever follows.
    pub parent_id: [u8; 8],
    /// Trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value by the W3C Trace Context rules: lowercase hex only, a
    /// version other than `ff`, ids not all zero, exactly 55 characters for version `00` and
    /// (for a later version, which may append fields) a `-` after the first 55. `None` for
    /// anything else: an invalid header is ignored, never an error.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let value = value.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
            return None;
        }
        let version = hex_bytes::<1>(value.get(0..2)?)?[0];
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if [2, 35, 52].iter().any(|&i| bytes[i] != b'-') {
            return None;
        }
        let trace_id = hex_bytes::<16>(value.get(3..35)?)?;
        let parent_id = hex_bytes::<8>(value.get(36..52)?)?;
        let flags = hex_bytes::<1>(value.get(53..55)?)?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent id as 16 lowercase hex digits.
    pub fn parent_id_hex(&self) -> String {
        hex(&self.parent_id)
    }
}

/// Written as version `00`, whatever version it was read from (as the W3C rules ask of a
/// participant that passes a context on).
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.parent_id),
            self.flags
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from exactly `2 * N` lowercase hex digits.
fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_reads_and_writes_back() {
        let tp = TraceParent::parse(GOOD).unwrap();
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.parent_id_hex(), "00f067aa0ba902b7");
        assert_eq!(tp.flags, 1);
        assert_eq!(tp.to_string(), GOOD);
        // A later version may append fields; it is passed on as version 00.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra";
        assert_eq!(
            TraceParent::parse(later).unwrap().to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00x",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }
}
