//! Kafka mode under deterministic simulation (`sendledger_bench::simulation`, what it runs and
//! what it checks: `docs/testing.md`): a bounded range of seeds on every test run (about a
//! minute; `scripts/simulate` runs any range), replay of a seed, and proof that the checks
//! see what a defence prevents.

use sendledger_bench::simulation::{run, Options, Report};

/// Seeds of every test run, from `SENDLEDGER_TEST_SEED` (default 1) on.
const SEEDS: u64 = 200;

/// Seeds that reach a deposed owner's late first byte, where only the send lease stands
/// between the schedule and a second record at the remote (3 of seeds 1 to 299, found with
/// `scripts/simulate --seeds 1..300 --without-send-lease` once the brokers abort a fenced
/// writer's open transaction, as Kafka does).
const LATE_SENDERS: [u64; 3] = [14, 28, 154];

/// Seeds that once broke a rule, kept. 7467 and 8536: a partition's log lost the commit that confirmed a
/// task while its owner, with nothing to write, kept the task settled in its copy; the run
/// ended with the task unsettled in the log (the final rebalance now takes every partition over
/// again, and the take-over truncates the copy and sends the task to review).
const REGRESSIONS: [u64; 2] = [7467, 8536];

/// Seeds where a take-over finds its copy holding the log's last transaction already and only
/// reading that transaction again publishes its lost results: a take-over cut short had the
/// brokers commit its predecessor's open transaction in part (without its results), and that
/// transaction reached the next owner's copy without a restore (its writer, answered that it
/// committed, recorded it; or a standby applied it). Each fails when a take-over reads the log
/// from its checkpoint instead (found with that change, 5 of 1,000 seeds).
const LAST_TRANSACTION_READ_AGAIN: [u64; 5] = [522, 676, 688, 1028, 1251];

/// The options that replay the schedules the fixed seeds above were found with (before the
/// newer moves: standby copies, take-overs cut short).
fn as_found() -> Options {
    Options {
        newer_moves: false,
        ..Options::default()
    }
}

fn simulate(seed: u64, options: &Options) -> Report {
    let dir = tempfile::tempdir().unwrap();
    run(seed, dir.path(), options).unwrap_or_else(|e| panic!("seed {seed}: {e:#}"))
}

#[test]
fn kafka_mode_keeps_its_promises_over_200_seeded_schedules() {
    let first = crate::seed(1);
    let options = Options::default();
    let mut failed = Vec::new();
    let mut total = Report::default();
    // Seeds whose log holds records of both encodings (instances writing JSON and binary).
    let mut mixed = 0;
    for seed in first..first + SEEDS {
        let report = simulate(seed, &options);
        mixed += u64::from((1..options.instances).contains(&report.binary_instances));
        if !report.violations.is_empty() {
            failed.push(format!("seed {seed}: {:#?}", report.violations));
        }
        total.steps += report.steps;
        total.take_overs += report.take_overs;
        total.crashes += report.crashes;
        total.freezes += report.freezes;
        total.leases_expired += report.leases_expired;
        total.lost_responses += report.lost_responses;
        total.lost_tails += report.lost_tails;
        total.copies_truncated += report.copies_truncated;
        total.commits_failed += report.commits_failed;
        total.standby_events += report.standby_events;
        total.take_overs_cut += report.take_overs_cut;
        total.succeeded += report.succeeded;
        total.reviews += report.reviews;
    }
    assert!(
        failed.is_empty(),
        "{} of {SEEDS} seeds broke a rule (replay one with `sendledger-bench simulate --seeds N..N+1 --trace`):\n{}",
        failed.len(),
        failed.join("\n")
    );
    // The schedules went where the promises are at stake.
    eprintln!("{total:?}");
    for (what, n) in [
        ("take-overs", total.take_overs),
        ("crashes", total.crashes),
        ("freezes", total.freezes),
        ("first bytes refused past the lease", total.leases_expired),
        ("lost responses", total.lost_responses),
        ("lost acknowledged commits", total.lost_tails),
        ("copies truncated to their log", total.copies_truncated),
        ("failed commits", total.commits_failed),
        ("events applied by standby copies", total.standby_events),
        ("take-overs cut short", total.take_overs_cut),
        ("logs of JSON and binary event records", mixed),
    ] {
        assert!(n > 0, "no {what} in {SEEDS} seeds");
    }
    assert!(total.succeeded > total.reviews * 4, "{total:?}");
}

#[test]
fn the_seeds_that_once_failed_pass() {
    for seed in REGRESSIONS {
        let report = simulate(seed, &as_found());
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
    }
}

#[test]
fn the_seeds_that_need_the_last_transaction_read_again_pass() {
    for seed in LAST_TRANSACTION_READ_AGAIN {
        let report = simulate(seed, &Options::default());
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        assert!(report.take_overs_cut > 0, "seed {seed}");
    }
}

#[test]
fn a_seed_replays_exactly() {
    let options = Options::default();
    let once = serde_json::to_string(&simulate(3, &options)).unwrap();
    let again = serde_json::to_string(&simulate(3, &options)).unwrap();
    assert_eq!(once, again);
}

/// Without the send lease, a deposed owner that was stopped between its intent and its first
/// byte sends after the partition's new owner resent (its lookups found nothing until the
/// deadline): two records at the remote. The same seeds with the lease pass.
#[test]
fn without_the_send_lease_a_deposed_owner_sends_a_second_time() {
    let unsafe_options = Options {
        send_lease: false,
        ..Options::default()
    };
    for seed in LATE_SENDERS {
        let report = simulate(seed, &unsafe_options);
        assert!(
            (report.violations.iter()).any(|v| v.contains("records at the remote")),
            "seed {seed}: {:?}",
            report.violations
        );
        let report = simulate(seed, &Options::default());
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        assert!(report.leases_expired > 0, "seed {seed}");
    }
}
