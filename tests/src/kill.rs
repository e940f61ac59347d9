//! An engine child process (`src/bin/engine_child.rs`) SIGKILLed at random moments while its
//! requests are in flight, started again on the same ledger each time (submitting its tasks
//! again, as Kafka would redeliver them), until a last run settles every task.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};

/// How to run the child and how often to kill it.
pub struct Kills<'a> {
    /// The child's executable (`CARGO_BIN_EXE_engine_child`) and its arguments.
    pub exe: &'a str,
    pub args: Vec<String>,
    /// Seed of the kill times.
    pub seed: u64,
    pub kills: usize,
    /// Once the remotes see a request of a run, the kill comes within this many ms.
    pub kill_within_ms: u64,
}

/// Runs the child `kills + 1` times: each of the first `kills` runs is SIGKILLed within
/// `kill_within_ms` of the remotes' first request of the run (`requests` counts the requests
/// the remotes received); a run in which nothing reaches them within 10 s is let finish. The
/// last run must print `settled` and exit 0 within 120 s. Returns the kills made, or why the
/// last run failed.
pub async fn kill_and_restart(run: Kills<'_>, requests: impl Fn() -> u64) -> Result<usize, String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(run.seed);
    let mut kills = 0;
    for round in 0..=run.kills {
        let mut child = Command::new(run.exe)
            .args(&run.args)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", run.exe))?;
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        if rx.recv().await.as_deref() != Some("started") {
            return Err(format!("round {round}: the engine did not start"));
        }
        let before = requests();
        let busy = async {
            while requests() == before {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
        };
        let busy = round < run.kills
            && tokio::time::timeout(Duration::from_secs(10), busy)
                .await
                .is_ok();
        if busy {
            let ms = rng.random_range(0..run.kill_within_ms);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            child.kill().map_err(|e| e.to_string())?;
            child.wait().map_err(|e| e.to_string())?;
            kills += 1;
            continue;
        }
        let pid = child.id();
        let wait = tokio::task::spawn_blocking(move || child.wait());
        let Ok(status) = tokio::time::timeout(Duration::from_secs(120), wait).await else {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return Err("the final run did not settle within 120 s".into());
        };
        let status = status
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("the final run failed: {status}"));
        }
        let mut lines = Vec::new();
        while let Ok(line) = rx.try_recv() {
            lines.push(line);
        }
        if !lines.iter().any(|l| l == "settled") {
            return Err(format!("the final run did not settle: {lines:?}"));
        }
    }
    Ok(kills)
}
