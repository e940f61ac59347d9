//! The versioned envelope of stored values: one format-version byte, then bincode.
//!
//! Old bytes are never reinterpreted: a change to any stored type needs a new version byte and
//! a decoder for it. The golden fixtures in `tests/fixtures/` pin each version.
//!
//! - Version 1: the events of the first release.
//! - Version 2: version 1 plus new enum variants at the end (`ReviewReason::LookupsFailed`,
//!   `NotSentCause::LocalResources`).
//!   Every version-1 value is a valid version-2 value with the same bytes, so both decode with
//!   the same types; a build that reads only version 1 refuses version 2 by its byte instead of
//!   failing on an unknown variant.
// format: do not change (versions 1 and 2 are on disk)

use sendledger_core::Event;

use crate::error::{Error, Result};

pub const EVENT_V1: u8 = 1;
/// The envelope version this build writes.
pub const EVENT_V2: u8 = 2;

pub fn encode_event(event: &Event) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    out.push(EVENT_V2);
    // Serializing plain data into a Vec cannot fail.
    bincode::serialize_into(&mut out, event).expect("bincode into Vec is infallible");
    out
}

/// Decodes the event stored under `lsn`; the stored LSN must match its key.
pub fn decode_event(lsn: u64, bytes: &[u8]) -> Result<Event> {
    match bytes.first() {
        Some(&(EVENT_V1 | EVENT_V2)) => {
            let event: Event = bincode::deserialize(&bytes[1..]).map_err(|e| Error::Corrupt {
                lsn,
                detail: e.to_string(),
            })?;
            if event.lsn != lsn {
                return Err(Error::Corrupt {
                    lsn,
                    detail: format!("stored under lsn {lsn} but says lsn {}", event.lsn),
                });
            }
            Ok(event)
        }
        Some(&version) => Err(Error::UnknownEnvelope { lsn, version }),
        None => Err(Error::Corrupt {
            lsn,
            detail: "empty value".into(),
        }),
    }
}
