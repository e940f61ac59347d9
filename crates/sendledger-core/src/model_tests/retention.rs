//! Retention: what it may remove, and that a task read back from what it keeps goes on as it
//! would have from its whole history.

use proptest::prelude::*;

use super::properties::{policy, step, to_input};
use super::*;
use crate::event::Retained;
use crate::result::Projection;

/// The harness of a task whose history is replaced by what retention keeps of it.
fn pruned(h: &Harness, retained: &Retained) -> Harness {
    let task = h.state.task_id.expect("accepted");
    let mut after = Harness::new(h.policy.clone());
    after.now = h.now;
    after.log = vec![retained.event(task)];
    after.state = fold(&after.log);
    after
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Whatever a task went through, retention keeps something of it only when it is settled
    /// with a terminal result (never in progress, in review or waiting), and the task read back
    /// from it answers a duplicate with the result its history ended with, refuses another
    /// payload as a conflict and a retry, sends nothing, and breaks no rule; and so does it once
    /// the events recorded since are removed in turn.
    #[test]
    fn retention_keeps_only_settled_tasks_and_they_answer_as_before(policy in policy(), steps in proptest::collection::vec(step(), 1..60)) {
        let mut h = Harness::new(policy);
        h.step(deliver(5, 0)).unwrap();
        let mut offset = 1;
        for s in steps {
            let Some(input) = to_input(&mut h, s, &mut offset) else { continue };
            let _ = h.step(input);
        }
        let retained = Retained::of(&h.log);
        prop_assert_eq!(retained.is_some(), h.state.phase.is_terminal(), "{:?} kept {:?}", h.state.phase, retained);
        let Some(retained) = retained else { return Ok(()) };
        let before = Projection::of(&h.log);
        let mut after = pruned(&h, &retained);
        prop_assert_eq!(after.state.phase, h.state.phase);
        prop_assert_eq!(after.state.next_seq, h.state.next_seq);
        prop_assert_eq!(after.state.payload_hash, h.state.payload_hash);
        prop_assert_eq!(after.state.version, h.state.version);
        prop_assert!(after.state.retryable().is_err());

        after.step(deliver(5, 999)).unwrap();
        after.step(deliver(6, 1000)).unwrap();
        let names = after.names();
        prop_assert_eq!(&names[1..], &["DuplicateDelivery", "RequestConflict"][..]);
        prop_assert!(after.sends.is_empty());
        let retry = after.step(Input::Operator(OperatorResolution::Retry { by: "ana".into(), reason: "again".into() }));
        prop_assert!(retry.is_err());

        let mut projection = Projection::default();
        let announced: Vec<_> = after.log.iter().filter_map(|e| projection.apply(e)).collect();
        let original = before.announced().expect("a settled task announced a result");
        prop_assert_eq!(announced.len(), 2);
        let again = &announced[0];
        prop_assert_eq!(&again.event_id, &original.event_id);
        prop_assert_eq!(again.status, original.status);
        prop_assert_eq!(&again.remote_id, &original.remote_id);
        prop_assert_eq!(&again.remote_target, &original.remote_target);
        prop_assert_eq!(&again.reason, &original.reason);
        prop_assert_eq!((again.attempts, again.version, again.lsn, again.at), (original.attempts, original.version, original.lsn, original.at));
        prop_assert_eq!(announced[1].status, crate::ResultStatus::Conflict);

        let (_, violations) = check_task(&after.log, CheckConfig::default());
        prop_assert!(violations.is_empty(), "{:?}", violations);

        // The events recorded since are removed in turn: what is kept then is the same but
        // for the events it stands for, and the task answers as before.
        prop_assert!(!pruned(&h, &retained).state.recorded_since_pruned());
        prop_assert!(after.state.recorded_since_pruned());
        let again_kept = Retained::of(&after.log).expect("still settled");
        prop_assert_eq!(&again_kept, &Retained { events: after.state.next_seq, ..retained.clone() });
        let mut twice = pruned(&after, &again_kept);
        prop_assert!(!twice.state.recorded_since_pruned());
        prop_assert_eq!(twice.state.next_seq, after.state.next_seq);
        twice.step(deliver(5, 1001)).unwrap();
        let mut projection = Projection::default();
        let announced: Vec<_> = twice.log.iter().filter_map(|e| projection.apply(e)).collect();
        prop_assert_eq!(announced.len(), 1);
        prop_assert_eq!(&announced[0].event_id, &original.event_id);
    }
}

/// A history that does not begin where the retained task does is caught by the rules.
#[test]
fn a_pruned_event_anywhere_but_first_breaks_the_sequence_rule() {
    let mut h = Harness::new(lookup_policy());
    h.step(deliver(5, 0)).unwrap();
    h.step(Input::Outcome {
        attempt: 1,
        outcome: AttemptOutcome::Succeeded {
            remote_id: "r-1".into(),
            status: 201,
            answer: Default::default(),
        },
    })
    .unwrap();
    let retained = Retained::of(&h.log).expect("succeeded");
    assert_eq!(retained.remote_id.as_deref(), Some("r-1"));
    let mut late = retained.event(h.state.task_id.unwrap());
    late.task_seq = h.state.next_seq;
    let mut log = h.log.clone();
    log.push(late);
    let (_, violations) = check_task(&log, CheckConfig::default());
    assert!(
        violations.iter().any(|v| v.rule == Rule::Sequence),
        "{violations:?}"
    );
}
