//! One target against the simulated remote, for the tests of attempts and lookups: a request,
//! a target with short timeouts that looks records up by task id, a remote with faults.

use sendledger_core::{AcceptedRequest, Limits, TaskRequest};
use sendledger_effects::{Target, TargetConfig};
use sendledger_sim::{Faults, Sim, SimConfig};

/// The request `acme/payment.create/<key>` at target `payments` with `payload`, accepted.
pub fn request(key: &str, payload: serde_json::Value) -> AcceptedRequest {
    TaskRequest {
        tenant: "acme".into(),
        operation: "payment.create".into(),
        request_key: key.into(),
        target: "payments".into(),
        payload,
        payload_text: None,
        metadata: Default::default(),
        version: 0,
    }
    .accept(&Limits::default())
    .expect("valid test request")
}

/// A simulated remote with `faults`.
pub async fn start_sim(faults: Faults) -> Sim {
    Sim::start(SimConfig {
        faults,
        ..SimConfig::default()
    })
    .await
    .expect("sim starts")
}

/// A target against `sim` with short timeouts, storing the task id as `reference` and looking
/// records up by it (and the request key, the sim's identity field); `extra` is more TOML keys
/// (no tables), which replace the defaults here.
pub fn config(sim: &Sim, extra: &str) -> TargetConfig {
    let base = format!(
        r#"
url = "{create}"
connect_timeout = "1s"
request_timeout = "3s"
body_fields = {{ request_key = "{{request_key}}", reference = "{{task_id}}" }}
lookup = {{ url = "{lookup}?reference={{task_id}}", first_check = "10ms", check_interval = "10ms", deadline = "1s" }}
"#,
        create = sim.create_url(),
        lookup = sim.lookup_url(),
    );
    let mut table: toml::Table = toml::from_str(&base).expect("base test config");
    let extra: toml::Table =
        toml::from_str(extra).unwrap_or_else(|e| panic!("test config: {e}\n{extra}"));
    table.extend(extra);
    toml::Value::Table(table)
        .try_into()
        .unwrap_or_else(|e| panic!("test config: {e}"))
}

/// [`config`] built into a target.
pub fn target(sim: &Sim, extra: &str) -> Target {
    Target::from_config("payments", &config(sim, extra)).expect("valid test target")
}

/// The default faults with `f` applied.
pub fn faults(f: impl FnOnce(&mut Faults)) -> Faults {
    let mut faults = Faults::default();
    f(&mut faults);
    faults
}
