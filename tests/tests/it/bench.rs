//! The `sendledger-bench` command as a user runs it: a child process and its JSON report. The
//! benchmarks start the `sendledger` command built for these tests (`SENDLEDGER_BIN`) where
//! they need a service or a remote of their own.

use std::process::Command;

fn bench() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sendledger_bench_cli"));
    command.env("SENDLEDGER_BIN", env!("CARGO_BIN_EXE_sendledger_cli"));
    command
}

/// Runs the benchmark with `args` and returns what it printed on stdout; fails (showing its
/// stdout and stderr) unless it exited 0.
fn output_of_success(args: &[&str]) -> (String, String) {
    sendledger_tests::process::output_of_success(bench().args(args))
}

/// `sendledger-bench effects --tls` with tiny counts reports both schemes and their ratio: every attempt
/// succeeded with one record at its remote (none twice), https over pooled connections (one
/// per attempt in flight at most) with no failed handshake, and the ratio is https over http.
/// Without `--tls` there is no https part.
#[test]
fn bench_effects_with_tls_reports_http_and_https_attempts_and_their_ratio() {
    let (stdout, _) = output_of_success(&[
        "effects",
        "--tls",
        "--seconds",
        "0.4",
        "--in-flight",
        "2",
        "--rounds",
        "2",
    ]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let https = &report["https"];
    assert_eq!(report["connections"], "pooled", "{report}");
    assert_eq!(report["rounds"], 2, "{report}");
    for run in [&report, https] {
        assert!(run["attempts"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(run["outcomes"]["succeeded"], run["attempts"], "{report}");
        assert_eq!(run["sim"]["duplicates"], 0, "{report}");
    }
    assert_eq!(https["sim"]["records"], https["attempts"], "{report}");
    assert_eq!(https["sim"]["handshakes_failed"], 0, "{report}");
    assert!(
        https["sim"]["connections"].as_u64().unwrap() <= 2,
        "{report}"
    );
    let http_rate = report["attempts_per_sec"].as_f64().unwrap();
    let https_rate = https["attempts_per_sec"].as_f64().unwrap();
    let ratio = report["https_to_http_ratio"].as_f64().unwrap();
    assert!(
        (ratio - https_rate / http_rate).abs() < 0.011,
        "ratio {ratio} is not https/http: {report}"
    );

    let out = bench()
        .args(["effects", "--seconds", "0.1", "--in-flight", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["attempts"].as_u64().unwrap() > 0, "{report}");
    assert!(report.get("https").is_none(), "{report}");
    assert!(report.get("https_to_http_ratio").is_none(), "{report}");
}

/// `sendledger-bench kafka --compare-engine` with a few tasks: every task answered once through the
/// embedded cluster with no duplicate at the remote, both paths' tasks per second and CPU time
/// per task reported, and the ratio is the Kafka path's rate over the engine's.
#[test]
fn bench_kafka_compares_the_kafka_path_with_the_engine_alone() {
    let (stdout, _) = output_of_success(&["kafka", "--compare-engine", "--tasks", "300"]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["tasks"], 300, "{report}");
    assert_eq!(report["remote_duplicates"], 0, "{report}");
    for figure in [
        "tasks_per_sec",
        "engine_tasks_per_sec",
        "cpu_us_per_task",
        "engine_cpu_us_per_task",
    ] {
        assert!(report[figure].as_f64().unwrap() > 0.0, "{figure}: {report}");
    }
    let ratio = report["ratio_to_engine"].as_f64().unwrap();
    let expected = report["tasks_per_sec"].as_f64().unwrap()
        / report["engine_tasks_per_sec"].as_f64().unwrap();
    assert!(
        (ratio - expected).abs() < 0.001,
        "ratio {ratio} is not kafka/engine: {report}"
    );
}

/// `sendledger-bench kafka --service-process` with a few tasks at a rate: the service runs as a
/// `sendledger run` child on the configuration the benchmark writes for it, every task's result
/// is read back with no duplicate at the remote, and the report gives the child's peak RSS and
/// no figure only the in-process service can know.
#[test]
fn bench_kafka_runs_the_service_in_a_child_process() {
    let (stdout, _) = output_of_success(&[
        "kafka",
        "--service-process",
        "--tasks",
        "300",
        "--rate",
        "1000",
    ]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["tasks"], 300, "{report}");
    assert_eq!(report["service_process"], true, "{report}");
    assert_eq!(report["remote_duplicates"], 0, "{report}");
    assert!(report["tasks_per_sec"].as_f64().unwrap() > 0.0, "{report}");
    let rss = report["peak_rss_bytes"].as_u64().unwrap();
    assert!((1 << 20..4 << 30).contains(&rss), "{report}");
    for unknown in ["fsyncs_per_task", "events_per_task"] {
        assert!(report[unknown].is_null(), "{unknown}: {report}");
    }
    assert!(
        report["cpu_us_per_task"].as_f64().unwrap() > 0.0,
        "the child's own: {report}"
    );
}

/// `sendledger-bench front` with tiny counts: every POST answered 201 with a succeeded result,
/// one record each at the remote and none twice, the service's CPU and memory measured, and the
/// Kafka path beside it in the same run.
#[test]
fn bench_front_submits_over_http_and_compares_with_the_kafka_path() {
    let (stdout, _) = output_of_success(&[
        "front",
        "--tasks",
        "200",
        "--connections",
        "8",
        "--compare-kafka",
    ]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["answered_201"], 200, "{report}");
    assert_eq!(report["answered_other"], 0, "{report}");
    assert_eq!(report["remote_records"], 200, "{report}");
    assert_eq!(report["remote_duplicates"], 0, "{report}");
    for positive in [
        "tasks_per_sec",
        "latency_ms_p99",
        "service_cpu_us_per_task",
        "kafka_tasks_per_sec",
        "kafka_service_cpu_us_per_task",
        "ratio_to_kafka",
    ] {
        assert!(
            report[positive].as_f64().unwrap() > 0.0,
            "{positive}: {report}"
        );
    }
    let rss = report["service_peak_rss_bytes"].as_u64().unwrap();
    assert!((1 << 20..4 << 30).contains(&rss), "{report}");
}
