//! Kafka mode as it is deployed: several `sendledger run` processes in one consumer group on
//! Apache Kafka (three brokers), each with its own configuration file and data
//! directory, while requests keep coming: the failover after a `kill -9` and after a restart
//! on the intact disk, measured; a partition whose log failed while the group still assigns it
//! is taken over again. Each test checks what a user would: the records at the remote, the
//! results a `read_committed` consumer of the results topic sees, and the audit of the events
//! topic (the log of record).
//!
//! The harness (instances, the group, the timeline of who owned which partition when, read
//! from each process's own log) is `sendledger_tests::cluster`. The chaos soaks (kills,
//! scaling, a wiped disk, a frozen instance) are the `soak` test target (`tests/soak/`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use sendledger_core::{Event, EventBody, UnknownCause};
use sendledger_kafka::PartitionLog;
use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::cluster::{
    assert_settled_once, each_answered, read_and_audit_log, start_broker, Group, Instance,
    KeptOnFailure, ResultsFollower, Said, Stream, Timeline, PARTITIONS, TIMEOUT,
};
use sendledger_tests::kafka::task_ids;

use crate::SENDLEDGER;

/// Milliseconds since the Unix epoch, the clock of events' `at`.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A task in review after a kill -9 is allowed only as the kill leaves it: the killed owner
/// committed the task's intent and was killed before it wrote the attempt's first byte (the
/// intent is durable before any byte, so the next owner cannot tell whether the request left).
/// So: its one attempt's intent was recorded before the kill, was found sending by the next
/// owner (`Recovery`), and no lookup ever matched (the remote holds no record:
/// [`assert_settled_once`] checked it). Rule 4 of docs/rules.md: no match is not proof that
/// nothing was sent, so such a task waits for an operator instead of being sent again.
fn assert_reviews_left_by_the_kill(reviews: &[String], events: &[Event], killed_at_ms: u64) {
    for key in reviews {
        let task = sendledger_tests::engine::task_id(key);
        let bodies: Vec<(&EventBody, u64)> = events
            .iter()
            .filter(|e| e.task_id == task)
            .map(|e| (&e.body, e.at))
            .collect();
        let intents: Vec<u64> = bodies
            .iter()
            .filter(|(b, _)| matches!(b, EventBody::SendIntended { .. }))
            .map(|(_, at)| *at)
            .collect();
        let recovered = bodies.iter().any(|(b, _)| {
            matches!(
                b,
                EventBody::SendUnknown {
                    cause: UnknownCause::Recovery,
                    ..
                }
            )
        });
        let matched = bodies.iter().any(
            |(b, _)| matches!(b, EventBody::LookupPerformed { matches, .. } if !matches.is_empty()),
        );
        assert!(
            intents.len() == 1 && intents[0] <= killed_at_ms && recovered && !matched,
            "{key} is in review, and not as a killed owner's unsent intent: {bodies:?}"
        );
    }
    eprintln!(
        "tasks in review, their intent committed by the killed owner and never sent: {reviews:?}"
    );
}

/// Waits (90 s at most) until `n` requests or more of `stream` on each partition are answered,
/// while the instances running stay alive; returns the tasks answered.
async fn answered_on_each(
    group: &mut Group,
    results: &ResultsFollower,
    stream: &Stream,
    n: usize,
) -> BTreeSet<String> {
    let limit = Instant::now() + Duration::from_secs(90);
    loop {
        let answered = results.answered();
        let produced = stream.produced();
        let fewest = (0..PARTITIONS)
            .map(|p| {
                (produced.iter())
                    .filter(|(k, q)| {
                        *q == p
                            && answered.contains(&sendledger_tests::engine::task_id(k).to_string())
                    })
                    .count()
            })
            .min()
            .unwrap_or(0);
        if fewest >= n {
            return answered;
        }
        group.assert_alive();
        assert!(
            Instant::now() < limit,
            "{fewest} tasks answered on a partition, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `restored` field of run `run`'s `partition restored from its log and resumed` lines in
/// an instance's log, by partition.
fn restored_events(log: &Path, run: usize) -> BTreeMap<i32, u64> {
    let text = std::fs::read_to_string(log).unwrap();
    let mut current = None;
    let mut restored = BTreeMap::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        if let Some(test) = value["test"].as_str() {
            current = test
                .rsplit(' ')
                .nth(1)
                .and_then(|n| n.parse::<usize>().ok());
            continue;
        }
        let fields = &value["fields"];
        if current == Some(run)
            && fields["message"] == "partition restored from its log and resumed"
        {
            if let (Some(p), Some(n)) = (fields["partition"].as_i64(), fields["restored"].as_u64())
            {
                restored.insert(p as i32, n);
            }
        }
    }
    restored
}

/// Failover, measured. Instance A starts alone and answers requests streaming in on every
/// partition (40 tasks each at least); B joins and the partitions are split. A is killed
/// (`kill -9`); the time until B answers requests produced after the kill on every partition
/// A owned (A's 6 s session expiring, the rebalance, B opening and restoring the logs) is
/// printed. Then A is started again on its intact disk; the time until it answers, on every
/// partition it takes back, requests produced once it took them back is printed, with the
/// events its restores applied: only those written since its checkpoints, so not the events
/// of the tasks it settled while it was alone. Nothing is sent twice and every task settles
/// once: the remote's records, the results a `read_committed` consumer sees and the audit of
/// the events topic say so. (Dynamic membership: the tansu broker these tests ran on before never expired a static
/// member, see [`cluster_kafka`](sendledger_tests::cluster::cluster_kafka); with static membership on Kafka, a restart within the
/// session timeout keeps the partitions and needs no rebalance.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_after_a_kill_and_after_a_restart_on_an_intact_disk() {
    let root = KeptOnFailure::new();
    let (broker, kafka_config, kafka) = start_broker().await;
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let timeline = Timeline::default();
    let mut group = Group {
        instances: (0..2)
            .map(|id| Instance::new(SENDLEDGER, root.path(), id, &kafka_config, target.clone()))
            .collect(),
        timeline: timeline.clone(),
    };
    let (a, b) = (0, 1);
    let results = ResultsFollower::start(&kafka);
    let stream = Stream::start(&kafka, "failover", 5, Duration::from_millis(50));
    let wait_answered = |from: usize, partitions: BTreeSet<i32>| {
        let limit = Instant::now() + Duration::from_secs(60);
        let (results, stream) = (&results, &stream);
        async move {
            loop {
                if each_answered(results, &stream.produced(), from, &partitions) {
                    return;
                }
                assert!(
                    Instant::now() < limit,
                    "partitions {partitions:?} answered nothing within a minute"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();

    // A alone settles 40 tasks on each partition at least.
    tokio::task::block_in_place(|| group.instances[a].start(&timeline));
    let answered_alone = answered_on_each(&mut group, &results, &stream, 40).await;

    // B joins; both answer.
    tokio::task::block_in_place(|| group.instances[b].start(&timeline));
    let took = group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        took.is_some(),
        "the partitions were not split: {}",
        group.owners()
    );
    let a_owned = timeline.owned(a, group.instances[a].run());
    wait_answered(stream.produced().len(), all.clone()).await;

    // kill -9 of A: B answers on A's partitions again.
    let before_kill = stream.produced().len();
    tokio::task::block_in_place(|| group.instances[a].kill());
    let killed = Instant::now();
    let killed_at_ms = now_ms();
    wait_answered(before_kill, a_owned.clone()).await;
    let kill_failover = killed.elapsed();
    let b_owns = timeline.owned(b, group.instances[b].run());
    assert_eq!(b_owns, all, "B owns every partition");

    // A restarted on its intact disk: it answers on the partitions it takes back.
    let restarted = Instant::now();
    tokio::task::block_in_place(|| group.instances[a].start(&timeline));
    let settled = group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        settled.is_some(),
        "the group did not settle: {}",
        group.owners()
    );
    let taken_back = timeline.owned(a, group.instances[a].run());
    // Requests produced once A took its partitions back: answered by A.
    wait_answered(stream.produced().len(), taken_back.clone()).await;
    let restart_failover = restarted.elapsed();
    let produced = stream.stop().await;

    let keys: Vec<String> = produced.iter().map(|(k, _)| k.clone()).collect();
    let tasks = task_ids(&keys);
    group
        .wait_answered(&results, &tasks, Duration::from_secs(60))
        .await;
    group.stop_all();
    let raw = results.stop();
    let ((events, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
    let reviews = assert_settled_once(&sim, &keys, &raw, &events);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_reviews_left_by_the_kill(&reviews, &events, killed_at_ms);
    assert_eq!(report.tasks, keys.len() as u64, "{report:?}");

    // A's restart restored only what was written since its checkpoints: not the events of
    // the tasks it settled while it was alone.
    let restored = restored_events(&group.instances[a].log_file(), 1);
    let partition_of: HashMap<_, _> = produced
        .iter()
        .map(|(k, p)| (sendledger_tests::engine::task_id(k), *p))
        .collect();
    let (mut held, mut settled_on_a) = (BTreeMap::<i32, u64>::new(), BTreeMap::<i32, u64>::new());
    for e in &events {
        let p = partition_of[&e.task_id];
        *held.entry(p).or_default() += 1;
        if answered_alone.contains(&e.task_id.to_string()) {
            *settled_on_a.entry(p).or_default() += 1;
        }
    }
    for p in &taken_back {
        let n = restored
            .get(p)
            .copied()
            .expect("A's log says what it restored");
        let kept = settled_on_a.get(p).copied().unwrap_or(0);
        assert!(
            n + kept <= held[p],
            "partition {p}: A restored {n} events after a restart on its disk, though it held \
             {kept} of the {} the partition holds",
            held[p]
        );
    }
    eprintln!(
        "failover: kill -9 of A (partitions {a_owned:?}) to B answering on all of them: \
         {kill_failover:?}; A restarted on its intact disk to answering on the partitions it \
         took back {taken_back:?}: {restart_failover:?}, restoring {restored:?} events \
         (the partitions hold {held:?}, of which A settled {settled_on_a:?} alone); {} tasks, \
         the remote: {:?}",
        keys.len(),
        sim.stats()
    );
    sim.shutdown().await;
    drop(broker);
}

/// Standby copies (`kafka.standby`): a take-over reads only the log's last moments. A and B
/// keep standby copies; A starts alone and settles 40 tasks on each partition at least
/// (events B's standby applies as A commits them), B joins and the partitions are split, then
/// A is killed (`kill -9`). B takes A's partitions over restoring only what its standby had
/// not applied yet (at most A's last transaction): fewer than a quarter of the events of the
/// tasks A settled alone on each of them, which is what B would restore without its standby
/// (it restores everything from its checkpoint, and it never held these partitions). Nothing
/// is sent twice, every task settles once, and the events topic audits clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_copy_makes_a_take_over_read_only_the_logs_last_moments() {
    let root = KeptOnFailure::new();
    let (broker, kafka_config, kafka) = start_broker().await;
    let kafka_config = sendledger_kafka::KafkaConfig {
        standby: true,
        ..kafka_config
    };
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let timeline = Timeline::default();
    let mut group = Group {
        instances: (0..2)
            .map(|id| Instance::new(SENDLEDGER, root.path(), id, &kafka_config, target.clone()))
            .collect(),
        timeline: timeline.clone(),
    };
    let (a, b) = (0, 1);
    let results = ResultsFollower::start(&kafka);
    let stream = Stream::start(&kafka, "standby", 5, Duration::from_millis(50));

    // A alone settles 40 tasks on each partition at least.
    tokio::task::block_in_place(|| group.instances[a].start(&timeline));
    let answered_alone = answered_on_each(&mut group, &results, &stream, 40).await;

    // B joins; both answer for a while.
    tokio::task::block_in_place(|| group.instances[b].start(&timeline));
    let took = group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        took.is_some(),
        "the partitions were not split: {}",
        group.owners()
    );
    let a_owned = timeline.owned(a, group.instances[a].run());
    assert!(
        !a_owned.is_empty(),
        "A kept no partition: {}",
        group.owners()
    );
    // Cooperative rebalancing: B's joining revoked from A only what moved to B; the
    // partitions A kept were never revoked, so they never paused or were taken over again.
    let revoked: BTreeSet<i32> = (timeline.notes().iter())
        .filter(|n| n.instance == a)
        .filter_map(|n| match &n.said {
            Said::Revoked(ps) => Some(ps.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let b_owned = timeline.owned(b, group.instances[b].run());
    assert_eq!(
        revoked, b_owned,
        "A revoked {revoked:?} when B joined, B took {b_owned:?}, A kept {a_owned:?}"
    );
    eprintln!(
        "B joined: {} of {PARTITIONS} partitions paused and moved",
        revoked.len()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // kill -9 of A: B takes its partitions over.
    let before_kill = stream.produced().len();
    tokio::task::block_in_place(|| group.instances[a].kill());
    let killed_at_ms = now_ms();
    let limit = Instant::now() + Duration::from_secs(60);
    while !each_answered(&results, &stream.produced(), before_kill, &a_owned) {
        assert!(
            Instant::now() < limit,
            "B answered nothing on A's partitions {a_owned:?} within a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let standby_events = group.instances[b]
        .metrics()
        .and_then(|m| sendledger_tests::metric_value(&m, "sendledger_standby_events_total"))
        .unwrap_or(0.0);
    let produced = stream.stop().await;

    let keys: Vec<String> = produced.iter().map(|(k, _)| k.clone()).collect();
    let tasks = task_ids(&keys);
    group
        .wait_answered(&results, &tasks, Duration::from_secs(60))
        .await;
    group.stop_all();
    let raw = results.stop();
    let ((events, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
    assert_settled_once(&sim, &keys, &raw, &events);
    assert!(report.violations.is_empty(), "{:?}", report.violations);

    let restored = restored_events(&group.instances[b].log_file(), 0);
    let partition_of: HashMap<_, _> = (produced.iter())
        .map(|(k, p)| (sendledger_tests::engine::task_id(k), *p))
        .collect();
    let mut settled_on_a = BTreeMap::<i32, u64>::new();
    for e in &events {
        if answered_alone.contains(&e.task_id.to_string()) {
            *settled_on_a.entry(partition_of[&e.task_id]).or_default() += 1;
        }
    }
    for p in &a_owned {
        let n = restored[p];
        assert!(
            n * 4 < settled_on_a[p],
            "partition {p}: B restored {n} events taking it over from A, though its standby \
             followed the partition while A settled {} events of tasks on it",
            settled_on_a[p]
        );
    }
    assert!(standby_events > 0.0, "B's standby applied no event");
    eprintln!(
        "standby: B took A's partitions {a_owned:?} over restoring {restored:?} events (A \
         settled {settled_on_a:?} events of tasks alone on each partition; B's standby applied \
         {standby_events} events); A killed at {killed_at_ms} ms"
    );
    sim.shutdown().await;
    drop(broker);
}

/// A partition whose log fails while the group still assigns it here is taken over again, not
/// left stalled. One instance owns every partition while requests stream in; another writer
/// opens partition 0's log (as an instance outside the group would), which fences the
/// instance's writer: its next transaction on partition 0 fails (fenced, or timed out with an
/// unknown outcome).
/// The instance gives the partition's log up, says so, takes the partition over again (which
/// fences the intruder) and answers requests on it again; its other partitions go on
/// meanwhile. Nothing is sent twice, every task settles once, the events topic audits clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_whose_log_failed_is_taken_over_again() {
    let root = KeptOnFailure::new();
    let (broker, kafka_config, kafka) = start_broker().await;
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let mut group = Group::start(SENDLEDGER, root.path(), 1, &kafka_config, target).await;
    let timeline = group.timeline.clone();
    let results = ResultsFollower::start(&kafka);
    let stream = Stream::start(&kafka, "retake", 5, Duration::from_millis(50));
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let wait_answered = |from: usize, partitions: BTreeSet<i32>, limit: Duration| {
        let limit = Instant::now() + limit;
        let (results, stream) = (&results, &stream);
        async move {
            while !each_answered(results, &stream.produced(), from, &partitions) {
                assert!(
                    Instant::now() < limit,
                    "partitions {partitions:?} answered nothing new"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_answered(0, all.clone(), Duration::from_secs(60)).await;

    // Another writer opens partition 0's log.
    let intruder = tokio::task::block_in_place(|| PartitionLog::open(&kafka, 0, TIMEOUT))
        .expect("partition 0's log opens");
    let fenced_at = Instant::now();
    let before = stream.produced().len();
    // The other partitions go on meanwhile.
    wait_answered(before, (1..PARTITIONS).collect(), Duration::from_secs(20)).await;
    let limit = Instant::now() + Duration::from_secs(90);
    let retaken = || {
        let notes = timeline.notes();
        let lost = notes.iter().position(|n| n.said == Said::Lost(0))?;
        notes[lost..]
            .iter()
            .find(|n| n.said == Said::TakenOver(0))
            .map(|n| n.at)
    };
    let retaken_at = loop {
        if let Some(at) = retaken() {
            break at;
        }
        group.assert_alive();
        assert!(
            Instant::now() < limit,
            "partition 0 was not taken over again: {}",
            group.owners()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after = stream.produced().len();
    wait_answered(after, BTreeSet::from([0]), Duration::from_secs(30)).await;
    eprintln!(
        "partition 0 taken over again {:?} after another writer opened its log; answering \
         again after {:?}",
        retaken_at - fenced_at,
        fenced_at.elapsed()
    );
    drop(intruder);

    let produced = stream.stop().await;
    let keys: Vec<String> = produced.iter().map(|(k, _)| k.clone()).collect();
    let tasks = task_ids(&keys);
    group
        .wait_answered(&results, &tasks, Duration::from_secs(60))
        .await;
    group.stop_all();
    let raw = results.stop();
    let ((events, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
    assert_settled_once(&sim, &keys, &raw, &events);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.tasks, keys.len() as u64, "{report:?}");
    sim.shutdown().await;
    drop(broker);
}

/// Static members (`kafka.instance_id` unset: each derived from the host and its data
/// directory) with a 30 s session: one stopped gracefully (`SIGTERM`) leaves the group as it
/// stops, so the other takes its partitions over at once, long before the stopped member's
/// session could expire (a member that stays silent holds its partitions for the whole
/// session). Started again, it gets partitions back. Requests stream in throughout; every task
/// settles once and the log audits clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_static_member_stopped_gracefully_hands_its_partitions_over_at_once() {
    const SESSION: Duration = Duration::from_secs(30);
    let root = KeptOnFailure::new();
    let (broker, mut kafka_config, kafka) = start_broker().await;
    kafka_config.instance_id = None;
    kafka_config.properties.insert(
        "consumer.session.timeout.ms".into(),
        SESSION.as_millis().to_string(),
    );
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
    let mut group = Group::start(SENDLEDGER, root.path(), 2, &kafka_config, target).await;
    let timeline = group.timeline.clone();
    let results = ResultsFollower::start(&kafka);
    let stream = Stream::start(&kafka, "static", 5, Duration::from_millis(50));

    let moving = timeline.owned(1, 0);
    let stopping = Instant::now();
    let status = tokio::task::block_in_place(|| group.instances[1].terminate());
    assert!(status.success(), "{status:?}");
    let stopped = stopping.elapsed();
    let deadline = stopping + SESSION;
    let handed = loop {
        if let Some((at, _)) = timeline.taken_over(1, 0, &moving, stopping) {
            break at - stopping;
        }
        assert!(
            Instant::now() < deadline,
            "partitions {moving:?} were not taken over within the session: {}",
            group.owners()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "stopped in {stopped:?}; its partitions {moving:?} taken over {handed:?} after SIGTERM"
    );
    assert!(
        handed < SESSION / 2,
        "the partitions moved only after {handed:?}: the stopped member did not leave"
    );

    tokio::task::block_in_place(|| group.instances[1].start(&timeline));
    let took = group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        took.is_some(),
        "the restarted member got nothing: {}",
        group.owners()
    );
    let produced = stream.stop().await;
    let keys: Vec<String> = produced.iter().map(|(k, _)| k.clone()).collect();
    group.finish(results, &sim, &keys).await;
    sim.shutdown().await;
    drop(broker);
}
