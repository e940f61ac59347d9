//! The commands under test as a user runs them: a command that must succeed, and
//! `sendledger run` up to its `ready` line. Each is given the executable's path.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Runs `command` and returns what it printed on stdout and on stderr; fails (showing both)
/// unless it exited 0.
pub fn output_of_success(command: &mut Command) -> (String, String) {
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Starts `sendledger run --config FILE` (`sendledger` the executable at `exe`) with `env`
/// added, waits for its `ready` line, and returns the child and that line. Later output is
/// drained, so the child never blocks on (or writes to) a closed pipe.
pub fn start_run(exe: &str, config: &Path, env: &[(&str, String)]) -> (Child, String) {
    let mut child = Command::new(exe)
        .args(["run", "--config"])
        .arg(config)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, line) = read_ready(&mut child);
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (child, line)
}

/// Stops a `sendledger run` child with SIGTERM and checks that it exited cleanly (blocking).
pub fn stop_run(run: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGTERM) }, 0);
    let status = run.wait().unwrap();
    assert!(status.success(), "run did not stop cleanly: {status}");
}

/// Reads a server child's first stdout line, which must be its `ready` line; returns the rest
/// of its stdout and that line.
pub fn read_ready(child: &mut Child) -> (std::io::BufReader<ChildStdout>, String) {
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("ready "),
        "unexpected first line: {line:?}"
    );
    (out, line)
}

/// The admin tests' service child (`admin_child`): its admin address, its stdin for commands, its stdout for answers.
pub struct AdminChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    pub addr: String,
}

impl AdminChild {
    /// Starts the child `exe` (the tests' `admin_child`) on ledger `dir` with the target
    /// `target` (JSON) and the admin token `token` (`""`: none configured); with `brokers` it
    /// also consumes requests and publishes results.
    pub fn start(
        exe: &str,
        dir: &Path,
        target: &str,
        brokers: Option<&str>,
        token: &str,
    ) -> AdminChild {
        let mut child = Command::new(exe)
            .args([dir.to_str().unwrap(), target, token])
            .args(brokers)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("the child starts").unwrap();
        let addr = first
            .strip_prefix("admin ")
            .expect("admin ADDR")
            .to_string();
        AdminChild {
            child,
            stdin,
            lines,
            addr,
        }
    }

    /// Submits a request; returns the events it recorded.
    pub fn submit(&mut self, key: &str) -> String {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "submit {key}").unwrap();
        let line = self.lines.next().expect("an answer").unwrap();
        let rest = line
            .strip_prefix(&format!("submitted {key} "))
            .unwrap_or_else(|| panic!("unexpected answer {line:?}"));
        rest.to_string()
    }

    /// Closes stdin and waits for a clean stop.
    pub fn stop(mut self) {
        drop(self.stdin.take());
        assert_eq!(
            self.lines.next().map(Result::unwrap).as_deref(),
            Some("stopped")
        );
        assert!(self.child.wait().unwrap().success());
    }
}
