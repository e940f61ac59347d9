//! Kafka mode's circuit breakers, against Apache Kafka (three brokers) with
//! `sendledger run` processes in one consumer group: each instance has its own breaker per
//! target, fed by its own attempts (not shared, not restored from the log), and a task that
//! waits for an open breaker when its partition moves is resumed by the new owner and sent
//! once.
//!
//! The remote (the simulated one, over real sockets) is down by refusing connections: an
//! attempt refused is proven not sent, so a small breaker (4 calls) opens within the first
//! few attempts, and nothing reaches the remote before it is back. It must end with exactly one
//! POST per task. The breaker probes through the remote's stats endpoint (`health_url`), so no
//! task's attempt is risked as a probe.
//!
//! Requests are produced to partitions of one instance only (keyed by their identity, each key
//! chosen for its partition), so that the other instance's breaker has nothing to
//! judge: it must stay closed while the first one is open.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sendledger_core::{Event, EventBody, TaskId, WaitReason};
use sendledger_effects::TargetConfig;
use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::cluster::{
    assert_settled_once, read_and_audit_log, read_log, start_broker, Group, Instance,
    KeptOnFailure, ResultsFollower, Timeline, PARTITIONS,
};
use sendledger_tests::kafka::{identity_key, key_on, produce, request_json, task_ids};

use crate::SENDLEDGER;

/// The breaker's `minimum_calls` (and `window_calls`): it opens once 4 of the latest 4
/// attempts failed.
const MINIMUM_CALLS: usize = 4;

/// Milliseconds since the Unix epoch, the clock of events' `at`.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The test target with a small breaker: it opens when [`MINIMUM_CALLS`] attempts failed,
/// probes after 1 s with a `GET` of the remote's stats, which answers while the remote is up.
/// Enough attempts that the few spent before each breaker opens never exhaust a task.
fn target(sim: &Sim) -> TargetConfig {
    sendledger_tests::engine::target(&sim.base_url(), |t| {
        t["retry"]["max_attempts"] = 30.into();
        t["breaker"] = serde_json::json!({
            "window_calls": MINIMUM_CALLS,
            "minimum_calls": MINIMUM_CALLS,
            "failure_rate": 0.5,
            "open_for": "1s",
            "health_url": sim.stats_url(),
        });
    })
}

/// An instance's breaker of the target as its `/healthz` shows it: its state and how many
/// times it opened since the process started.
fn breaker(instance: &Instance) -> Option<(String, u64)> {
    let health = instance.health()?;
    let sim = &health["targets"]["sim"];
    Some((
        sim["breaker"].as_str()?.to_string(),
        sim["opened"].as_u64()?,
    ))
}

/// `sendledger_target_state{target="sim"}` in an instance's `/metrics` (0 closed, 1 open, 2
/// half-open).
fn target_state(instance: &Instance) -> Option<f64> {
    instance.metrics()?.lines().find_map(|l| {
        l.strip_prefix("sendledger_target_state{target=\"sim\"} ")?
            .trim()
            .parse()
            .ok()
    })
}

/// Polls `check` (blocking calls allowed) every 100 ms until it gives a value, failing after
/// `limit` with `what` and who owns which partition; fails too if an instance ended by itself.
async fn poll<T>(
    group: &mut Group,
    what: &str,
    limit: Duration,
    mut check: impl FnMut(&Group) -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        group.assert_alive();
        if let Some(value) = tokio::task::block_in_place(|| check(group)) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?} (owners {})",
            group.owners()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each task's events in the log, in order.
fn by_task(events: &[Event]) -> BTreeMap<TaskId, Vec<&Event>> {
    let mut tasks: BTreeMap<TaskId, Vec<&Event>> = BTreeMap::new();
    for e in events {
        tasks.entry(e.task_id).or_default().push(e);
    }
    for events in tasks.values_mut() {
        events.sort_by_key(|e| e.task_seq);
    }
    tasks
}

fn is_wait(e: &Event) -> bool {
    matches!(&e.body, EventBody::SendDeferred { reason: WaitReason::BreakerOpen { target }, .. } if target == "sim")
}

/// The tasks of the scenario: their keys and the partition each was produced to.
struct Tasks {
    partition_of: BTreeMap<String, i32>,
}

impl Tasks {
    fn keys(&self) -> Vec<String> {
        self.partition_of.keys().cloned().collect()
    }

    fn ids(&self) -> BTreeSet<String> {
        task_ids(&self.keys())
    }

    fn on(&self, partitions: &BTreeSet<i32>) -> BTreeSet<TaskId> {
        self.partition_of
            .iter()
            .filter(|(_, p)| partitions.contains(p))
            .map(|(k, _)| sendledger_tests::engine::task_id(k))
            .collect()
    }
}

/// The scenario up to the move: the broker, the remote (down), instances `0` (A) and `1` (B)
/// of a group of `instances` started and the partitions split between them, requests on A's
/// partitions only (5 to 9 each, the numbers and the order from `seed`), A's breaker open and
/// every task waiting, B's breaker closed.
struct Waiting {
    root: KeptOnFailure,
    broker: sendledger_tests::kafka::Broker,
    kafka: sendledger_kafka::Kafka,
    sim: Sim,
    group: Group,
    results: ResultsFollower,
    a_partitions: BTreeSet<i32>,
    tasks: Tasks,
}

const A: usize = 0;
const B: usize = 1;

async fn tasks_waiting_on_a(instances: usize, prefix: &str, seed: u64) -> Waiting {
    let root = KeptOnFailure::new();
    let (broker, kafka_config, kafka) = start_broker().await;
    let sim = Sim::start(SimConfig {
        seed,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    sim.set_offline(true).await.expect("the remote goes down");
    let target = target(&sim);
    let timeline = Timeline::default();
    let mut group = Group {
        instances: (0..instances)
            .map(|id| Instance::new(SENDLEDGER, root.path(), id, &kafka_config, target.clone()))
            .collect(),
        timeline: timeline.clone(),
    };
    for i in [A, B] {
        tokio::task::block_in_place(|| group.instances[i].start(&timeline));
    }
    let took = group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        took.is_some(),
        "the partitions were not split: {}",
        group.owners()
    );
    let a_partitions = timeline.owned(A, group.instances[A].run());
    let results = ResultsFollower::start(&kafka);

    // Requests on A's partitions, in a seeded order.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut partition_of = BTreeMap::new();
    for p in &a_partitions {
        for i in 0..rng.random_range(5..=9) {
            let key = key_on(&format!("{prefix}-{p}-{i}"), 0, *p, PARTITIONS);
            partition_of.insert(key, *p);
        }
    }
    let mut messages: Vec<_> = partition_of
        .keys()
        .map(|k| (None, identity_key(k), Some(request_json(k))))
        .collect();
    messages.shuffle(&mut rng);
    produce(&kafka, messages).await;
    let tasks = Tasks { partition_of };

    // A's breaker opens on A's attempts, and every task waits.
    let all = tasks.on(&a_partitions);
    let kafka_ = kafka.clone();
    poll(
        &mut group,
        "every task waiting on A",
        Duration::from_secs(30),
        |g| {
            let opened = breaker(&g.instances[A])?.1 >= 1;
            let events = read_log(&kafka_);
            let tasks = by_task(&events);
            let waiting = all
                .iter()
                .all(|t| tasks.get(t).is_some_and(|es| es.iter().any(|e| is_wait(e))));
            (opened && waiting).then_some(())
        },
    )
    .await;
    Waiting {
        root,
        broker,
        kafka,
        sim,
        group,
        results,
        a_partitions,
        tasks,
    }
}

/// While A's breaker is open, B's is closed and never opened: each instance has its own.
fn assert_a_open_b_closed(group: &Group) {
    let (a, b) = (&group.instances[A], &group.instances[B]);
    tokio::task::block_in_place(|| {
        let (state, opened) = breaker(a).expect("A answers /healthz");
        assert!(
            opened >= 1 && ["open", "half_open"].contains(&state.as_str()),
            "A's breaker: {state}, opened {opened} times"
        );
        assert!(
            matches!(target_state(a), Some(s) if s == 1.0 || s == 2.0),
            "A's sendledger_target_state: {:?}",
            target_state(a)
        );
        assert_eq!(
            breaker(b).expect("B answers /healthz"),
            ("closed".to_string(), 0),
            "B's breaker, while A's is open"
        );
        assert_eq!(target_state(b), Some(0.0), "B's sendledger_target_state");
    });
}

/// What a user checks at the end, once every task was answered and the instances stopped:
/// exactly one POST per task reached the remote (nothing was sent while it was down, nothing
/// twice), each task has one record there and exactly one terminal result (succeeded, naming
/// that record) that the log of record announces, none went to review; `audit --from-kafka`
/// finds no violation; every task recorded a wait for the open breaker while A owned it, and
/// no intent after it while A's breaker stayed open (`until_ms`: the move).
async fn assert_sent_once_and_waits_recorded(w: Waiting, until_ms: u64) -> Vec<Event> {
    let Waiting {
        root,
        broker,
        kafka,
        sim,
        results,
        tasks,
        ..
    } = w;
    let keys = tasks.keys();
    let raw = results.stop();
    let ((events, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
    let reviews = assert_settled_once(&sim, &keys, &raw, &events);
    assert!(reviews.is_empty(), "tasks in review: {reviews:?}");
    assert_eq!(
        sim.stats().posts,
        keys.len() as u64,
        "POSTs at the remote for {} tasks: {:?}",
        keys.len(),
        sim.stats()
    );
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.tasks, keys.len() as u64, "{report:?}");
    assert_eq!(
        report.tasks_by_state.get("succeeded"),
        Some(&(keys.len() as u64)),
        "{report:?}"
    );

    // The command, as a user runs it.
    let out = tokio::task::block_in_place(|| {
        crate::sendledger()
            .args(["audit", "--from-kafka", &kafka.config().events_topic])
            .args(["--brokers", kafka.config().brokers.as_str(), "--json"])
            .output()
            .unwrap()
    });
    let audit: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "audit --from-kafka printed no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{audit:#}");
    assert_eq!(audit["tasks"], keys.len(), "{audit:#}");

    // The waits, each before any intent that followed it while A's breaker was open.
    let logged = by_task(&events);
    for key in &keys {
        let task = sendledger_tests::engine::task_id(key);
        let events = &logged[&task];
        let first_wait = events
            .iter()
            .position(|e| is_wait(e) && e.at < until_ms)
            .unwrap_or_else(|| panic!("{key} recorded no wait on A: {events:?}"));
        let intents: Vec<&&Event> = events[first_wait..]
            .iter()
            .filter(|e| e.at < until_ms && matches!(e.body, EventBody::SendIntended { .. }))
            .collect();
        assert!(
            intents.is_empty(),
            "{key} recorded an intent while A's breaker was open: {events:?}"
        );
    }
    sim.shutdown().await;
    drop(broker);
    drop(root);
    events
}

/// The attempts recorded not sent for `tasks` between `from_ms` and `to_ms`.
fn not_sent_between(events: &[Event], tasks: &BTreeSet<TaskId>, from_ms: u64, to_ms: u64) -> usize {
    events
        .iter()
        .filter(|e| tasks.contains(&e.task_id) && (from_ms..to_ms).contains(&e.at))
        .filter(|e| matches!(e.body, EventBody::SendNotSent { .. }))
        .count()
}

/// A's breaker is open and its tasks wait when A is killed (`kill -9`). B, whose breaker never
/// opened, takes A's partitions over once A's 6 s session expired, and resumes the waiting
/// tasks with its own breaker, closed: it tries them against the remote, still down, and its
/// breaker opens from those attempts (a state shared between instances, or restored from the
/// waits in the log, would have had B wait without trying). Then the remote comes back: B's
/// breaker probes, closes, and every task is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_owners_waiting_tasks_are_sent_once_by_the_instance_that_takes_them_over() {
    let seed = crate::seed(37);
    let mut w = tasks_waiting_on_a(2, "kill", seed).await;
    assert_a_open_b_closed(&w.group);

    tokio::task::block_in_place(|| w.group.instances[A].kill());
    let killed_at_ms = now_ms();
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let timeline = w.group.timeline.clone();
    poll(
        &mut w.group,
        "B owns every partition",
        Duration::from_secs(40),
        |g| (timeline.owned(B, g.instances[B].run()) == all).then_some(()),
    )
    .await;

    // B tries the tasks it took over, and its breaker opens from its own attempts.
    let moved = w.tasks.on(&w.a_partitions);
    let kafka = w.kafka.clone();
    poll(
        &mut w.group,
        "B's breaker opened from its own attempts",
        Duration::from_secs(30),
        |g| {
            let (state, opened) = breaker(&g.instances[B])?;
            let tried = not_sent_between(&read_log(&kafka), &moved, killed_at_ms, u64::MAX);
            (opened >= 1 && tried >= MINIMUM_CALLS).then_some((state, opened, tried))
        },
    )
    .await;

    // The remote comes back.
    w.sim.set_offline(false).await.expect("the remote is back");
    let back_at_ms = now_ms();
    w.group
        .wait_answered(&w.results, &w.tasks.ids(), Duration::from_secs(40))
        .await;
    let (state, _) =
        tokio::task::block_in_place(|| breaker(&w.group.instances[B])).expect("B answers /healthz");
    assert_eq!(state, "closed", "B's breaker once the remote is back");
    w.group.stop_all();

    let events = assert_sent_once_and_waits_recorded(w, killed_at_ms).await;
    let tried_by_b = not_sent_between(&events, &moved, killed_at_ms, back_at_ms);
    assert!(
        tried_by_b >= MINIMUM_CALLS,
        "B recorded {tried_by_b} attempts not sent before its breaker opened"
    );
    eprintln!(
        "{} tasks waited on A's open breaker; after A's kill B tried them {tried_by_b} times \
         against the remote still down before its own breaker opened; one POST each once back",
        moved.len()
    );
}

/// The owner of each of `partitions` by the timeline, among the running instances.
fn owners(group: &Group, partitions: &BTreeSet<i32>) -> BTreeMap<i32, usize> {
    let mut owner = BTreeMap::new();
    for i in group.instances.iter().filter(|i| i.is_running()) {
        for p in group.timeline.owned(i.id, i.run()) {
            if partitions.contains(&p) {
                owner.insert(p, i.id);
            }
        }
    }
    owner
}

/// A's breaker is open and its tasks wait when a third instance, C, joins the group: the
/// partitions are split three ways, so some of A's move (to C, or to B) while A runs on with
/// its breaker open and its tasks' timers set. Each instance that took waiting tasks over
/// tries them with its own breaker, closed, and opens it from those attempts; A's tasks that
/// stayed with it keep waiting without an attempt. Then the remote comes back: every breaker
/// probes and closes, A included, and still every task is sent once, by its partition's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_waiting_when_their_partition_moves_to_a_new_member_are_sent_once() {
    const C: usize = 2;
    let seed = crate::seed(3737);
    let mut w = tasks_waiting_on_a(3, "join", seed).await;
    assert_a_open_b_closed(&w.group);

    let joined_at_ms = now_ms();
    let timeline = w.group.timeline.clone();
    tokio::task::block_in_place(|| w.group.instances[C].start(&timeline));
    let took = w.group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        took.is_some(),
        "the partitions were not split three ways: {}",
        w.group.owners()
    );
    let owner = owners(&w.group, &w.a_partitions);
    let moved: BTreeMap<usize, BTreeSet<i32>> =
        owner
            .iter()
            .filter(|(_, i)| **i != A)
            .fold(BTreeMap::new(), |mut by, (p, i)| {
                by.entry(*i).or_insert_with(BTreeSet::new).insert(*p);
                by
            });
    assert!(
        !moved.is_empty(),
        "none of A's partitions {:?} moved: {}",
        w.a_partitions,
        w.group.owners()
    );
    let stayed: BTreeSet<i32> = owner
        .iter()
        .filter(|(_, i)| **i == A)
        .map(|(p, _)| *p)
        .collect();

    // Each instance that took waiting tasks over opens its own breaker by trying them.
    let kafka = w.kafka.clone();
    for (taker, partitions) in &moved {
        let tasks = w.tasks.on(partitions);
        poll(
            &mut w.group,
            &format!("instance {taker}'s breaker opened from its own attempts on {partitions:?}"),
            Duration::from_secs(30),
            |g| {
                let (_, opened) = breaker(&g.instances[*taker])?;
                let tried = not_sent_between(&read_log(&kafka), &tasks, joined_at_ms, u64::MAX);
                (opened >= 1 && tried >= MINIMUM_CALLS).then_some(())
            },
        )
        .await;
    }
    let (state, _) =
        tokio::task::block_in_place(|| breaker(&w.group.instances[A])).expect("A answers /healthz");
    assert_ne!(state, "closed", "A's breaker, the remote still down");

    // The remote comes back: every task is answered, and every breaker closes, A's too (its
    // timers of the tasks that moved away have fired by then or fire on a closed breaker).
    w.sim.set_offline(false).await.expect("the remote is back");
    let back_at_ms = now_ms();
    w.group
        .wait_answered(&w.results, &w.tasks.ids(), Duration::from_secs(40))
        .await;
    poll(
        &mut w.group,
        "every breaker closed and no task live",
        Duration::from_secs(30),
        |g| {
            g.instances
                .iter()
                .all(|i| {
                    let health = i.health();
                    breaker(i).is_some_and(|(s, _)| s == "closed")
                        && health.is_some_and(|h| h["live_tasks"] == 0)
                })
                .then_some(())
        },
    )
    .await;
    w.group.stop_all();

    let stayed_tasks = w.tasks.on(&stayed);
    let events = assert_sent_once_and_waits_recorded(w, joined_at_ms).await;
    // The tasks that stayed with A waited until the remote was back, without an attempt.
    let intents_on_a = events
        .iter()
        .filter(|e| stayed_tasks.contains(&e.task_id) && (joined_at_ms..back_at_ms).contains(&e.at))
        .filter(|e| {
            matches!(
                e.body,
                EventBody::SendIntended { .. } | EventBody::SendNotSent { .. }
            )
        })
        .count();
    assert_eq!(
        intents_on_a, 0,
        "A attempted tasks of its partitions {stayed:?} while its breaker was open"
    );
    eprintln!(
        "A's partitions {:?}: {stayed:?} stayed with A, {moved:?} moved to new owners whose own \
         breakers opened on their attempts; one POST per task once the remote was back",
        owner.keys().collect::<Vec<_>>()
    );
}
