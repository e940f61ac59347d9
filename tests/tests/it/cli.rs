//! The `sendledger` command as a user runs it: a child process, its exit code and output.

use std::io::BufRead;
use std::process::{Command, Stdio};

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
}

/// The main job: the whole pipeline through embedded Kafka with faults, duplicates and a
/// restart, ending with every invariant checked (exit 0 only when all hold).
#[test]
fn demo_runs_clean() {
    let out = cli()
        .args(["demo", "--tasks", "300", "--seed", "7"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |name: &str| -> u64 {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no `{name}` row in:\n{stdout}"));
        line.split_whitespace().last().unwrap().parse().unwrap()
    };
    assert_eq!(row("tasks with a result on the topic"), 300);
    assert_eq!(row("identities with more than one record"), 0);
    assert_eq!(row("duplicates dropped"), 60);
    assert_eq!(row("audit violations"), 0);
    assert!(stdout.contains("OK: every task done once"), "{stdout}");
}

/// An invalid configuration stops `run` before it starts, naming the field.
#[test]
fn run_refuses_an_invalid_config_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "[kafka]\npartitions = 0\n[targets.p]\nurl = \"http://127.0.0.1:1/x\"\n",
    )
    .unwrap();
    let out = cli().args(["run", "--config"]).arg(&file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("kafka.partitions: is 0"), "{stderr}");
    let out = cli()
        .args(["run", "--config"])
        .arg(&file)
        .env("SENDLEDGER__KAFKA__PARTITIONS", "2")
        .env("SENDLEDGER__TARGETS__P__URL", "ftp://nowhere")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("targets.p.url"), "{stderr}");
}

/// `sim-remote` serves on the address it prints, creates records, and reports its ground
/// truth when stopped with SIGTERM.
#[test]
fn sim_remote_serves_until_sigterm() {
    let mut child = cli()
        .args(["sim-remote", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // `ready create=POST http://ADDR/records lookup=...`
    let mut words = line.split_whitespace().skip_while(|w| *w != "create=POST");
    let url = words
        .nth(1)
        .unwrap_or_else(|| panic!("no create url in {line:?}"));
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    let body = r#"{"request_key":"k1","amount":5}"#;
    std::io::Write::write_all(
        &mut stream,
        format!(
            "POST /records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let mut stats = String::new();
    out.read_line(&mut stats).unwrap();
    assert!(child.wait().unwrap().success());
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["records"], 1, "{stats}");
    assert_eq!(stats["duplicates"], 0, "{stats}");
}
