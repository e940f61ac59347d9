//! Shared helpers of sendledger's workspace integration tests (`tests/it/`) and of the child
//! processes they start (`src/bin/`).

use sendledger_core::{EventBody, NewEvent, TaskId};

/// The body of the `seq`-th event of writer task `task` in the crash tests. Deterministic, so
/// the verifier knows exactly what every stored event must contain; sizes vary from a few
/// bytes to a few kilobytes so that torn writes would show.
pub fn crash_body(task: u32, seq: u32) -> EventBody {
    let len = ((task as usize * 7919 + seq as usize * 104_729) % 4096) + 1;
    let fill = char::from(b'a' + ((task + seq) % 26) as u8);
    EventBody::OperatorNote {
        who: format!("writer-{task}"),
        text: format!("{seq}:{}", fill.to_string().repeat(len)),
    }
}

/// The task id of writer task `task` in the crash tests.
pub fn crash_task(task: u32) -> TaskId {
    TaskId::derive("crash", "append", &task.to_string())
}

pub fn crash_event(task: u32, seq: u32, at: u64) -> NewEvent {
    NewEvent {
        task_id: crash_task(task),
        task_seq: seq,
        at,
        body: crash_body(task, seq),
    }
}
