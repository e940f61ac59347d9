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
//! - Version 3: version 2 plus `EventBody::SendDeferred` and its `WaitReason` (a wait before an
//!   intent), the same way.
//! - Version 4: version 3 plus `EventBody::TaskRetried` (a failed task's new version), the
//!   same way.
//! - Version 5: version 4 plus `EventBody::SendIntendedAt` (an attempt at the task's
//!   fallback target), the same way.
//! - Version 6: version 5 plus `ReviewReason::DivergentHistory` (kafka mode: two owners'
//!   histories of a task found in its log), the same way.
//! - Version 7: version 6 plus `EventBody::StepsPlanned`, `EventBody::CompensationStarted`
//!   and `ReviewReason::{CompensationRefused, CompensationNotSent}` (multi-step tasks), the
//!   same way.
//! - Version 8: version 7 plus `EventBody::CompensationOrdered` (an operator's order to undo
//!   a step's duplicates or a whole multi-step task), `EventBody::StepAnswer` (fields of a
//!   step's answer that later steps read), `NotSentCause::NotBuilt` and
//!   `ReviewReason::StepNotBuilt` (a step's call that cannot be built), the same way.
//! - Version 9: version 8 plus `EventBody::OperatorCredential` (the named credential an
//!   operator's decision was made under), the same way.
//! - Version 10: version 9 plus `EventBody::RequestVersion` and `WaitReason::EarlierVersion`
//!   (request versions), the same way.
// format: do not change (versions 1 to 10 are on disk)

use sendledger_core::event::Millis;
use sendledger_core::{Event, EventBody, NewEvent, TaskId};
use serde::Serialize;

use crate::error::{Error, Result};

pub const EVENT_V1: u8 = 1;
pub const EVENT_V2: u8 = 2;
pub const EVENT_V3: u8 = 3;
pub const EVENT_V4: u8 = 4;
pub const EVENT_V5: u8 = 5;
pub const EVENT_V6: u8 = 6;
pub const EVENT_V7: u8 = 7;
pub const EVENT_V8: u8 = 8;
pub const EVENT_V9: u8 = 9;
/// The envelope version this build writes.
pub const EVENT_V10: u8 = 10;

/// An [`Event`]'s fields, borrowed: bincode writes a struct as its fields in order, so this
/// encodes as the event does.
#[derive(Serialize)]
struct EventFields<'a> {
    lsn: u64,
    task_id: TaskId,
    task_seq: u32,
    at: Millis,
    body: &'a EventBody,
}

fn encode(fields: EventFields<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    out.push(EVENT_V10);
    // Serializing plain data into a Vec cannot fail.
    bincode::serialize_into(&mut out, &fields).expect("bincode into Vec is infallible");
    out
}

pub fn encode_event(event: &Event) -> Vec<u8> {
    encode(EventFields {
        lsn: event.lsn,
        task_id: event.task_id,
        task_seq: event.task_seq,
        at: event.at,
        body: &event.body,
    })
}

/// The envelope of `event` recorded under `lsn`, without building the [`Event`].
pub fn encode_new_event(lsn: u64, event: &NewEvent) -> Vec<u8> {
    encode(EventFields {
        lsn,
        task_id: event.task_id,
        task_seq: event.task_seq,
        at: event.at,
        body: &event.body,
    })
}

/// Decodes the event stored under `lsn`; the stored LSN must match its key.
pub fn decode_event(lsn: u64, bytes: &[u8]) -> Result<Event> {
    let event = decode(lsn, bytes)?;
    if event.lsn != lsn {
        return Err(Error::Corrupt {
            lsn,
            detail: format!("stored under lsn {lsn} but says lsn {}", event.lsn),
        });
    }
    Ok(event)
}

/// Decodes an event encoded as the ledger stores it but kept elsewhere (a binary record of the
/// events topic), whatever LSN it names.
pub fn decode_record(bytes: &[u8]) -> Result<Event> {
    decode(0, bytes)
}

/// `bytes` decoded as an event envelope; errors name `lsn`.
fn decode(lsn: u64, bytes: &[u8]) -> Result<Event> {
    match bytes.first() {
        Some(
            &(EVENT_V1 | EVENT_V2 | EVENT_V3 | EVENT_V4 | EVENT_V5 | EVENT_V6 | EVENT_V7
            | EVENT_V8 | EVENT_V9 | EVENT_V10),
        ) => bincode::deserialize(&bytes[1..]).map_err(|source| Error::Undecodable { lsn, source }),
        Some(&version) => Err(Error::UnknownEnvelope { lsn, version }),
        None => Err(Error::Corrupt {
            lsn,
            detail: "empty value".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendledger_core::fixtures::{accepted, history};

    /// The journal's encoding of a new event is the event's, byte for byte (the golden
    /// fixtures pin the event's).
    #[test]
    fn a_new_event_encodes_as_the_event_it_becomes() {
        let (task, body) = accepted();
        let rejected = EventBody::InputRejected {
            source: sendledger_core::fixtures::src(3),
            reason: "not JSON".into(),
            raw: vec![0xff, b'{'],
        };
        for event in history(task, vec![body, rejected]) {
            let new = NewEvent {
                task_id: event.task_id,
                task_seq: event.task_seq,
                at: event.at,
                body: event.body.clone(),
            };
            assert_eq!(encode_new_event(event.lsn, &new), encode_event(&event));
            assert_eq!(
                decode_event(event.lsn, &encode_event(&event)).unwrap(),
                event
            );
        }
    }
}
