//! The versioned envelope of stored values: one format-version byte, then bincode.
//!
//! Old bytes are never reinterpreted: a change to any stored type needs a new version byte and
//! a decoder for it. The golden fixtures in `tests/fixtures/` pin version 1.
// format: do not change (version 1 is on disk)

use sendledger_core::Event;

use crate::error::{Error, Result};

/// The envelope version this build writes.
pub const EVENT_V1: u8 = 1;

pub fn encode_event(event: &Event) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    out.push(EVENT_V1);
    // Serializing plain data into a Vec cannot fail.
    bincode::serialize_into(&mut out, event).expect("bincode into Vec is infallible");
    out
}

/// Decodes the event stored under `lsn`; the stored LSN must match its key.
pub fn decode_event(lsn: u64, bytes: &[u8]) -> Result<Event> {
    match bytes.first() {
        Some(&EVENT_V1) => {
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
