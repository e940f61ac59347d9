//! `docker-compose.yml` and the `Dockerfile` cannot run here (no Docker), so they are checked
//! against the code: the compose file parses as YAML, the service's mounted configuration plus
//! the compose environment is a valid configuration for this build, and the topics, ports and
//! addresses it wires together agree with each other.

use std::collections::BTreeMap;
use std::path::Path;

use sendledger_node::config::Config;
use sendledger_sim::SimConfig;
use yaml_rust2::{Yaml, YamlLoader};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .unwrap_or_else(|| panic!("not a list: {y:?}"))
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// `${VAR:-default}` as compose resolves it with VAR unset.
fn resolve(value: &str) -> String {
    match value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
        Some(inner) => inner
            .split_once(":-")
            .map(|(_, default)| default.to_string())
            .unwrap_or_default(),
        None => value.to_string(),
    }
}

/// The image copies `schemas/` to `/etc/sendledger/`: a path in the container → in the repo.
fn repo_path(dockerfile: &str, container_path: &str) -> String {
    let copy = dockerfile
        .lines()
        .find(|l| l.starts_with("COPY schemas/"))
        .expect("the Dockerfile copies schemas/");
    let dest = copy.split_whitespace().nth(2).expect("COPY destination");
    let rest = container_path
        .strip_prefix(dest)
        .unwrap_or_else(|| panic!("{container_path} is not under {dest}"));
    format!("schemas/{rest}")
}

fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("no {name} in {args:?}"));
    &args[i + 1]
}

/// The configuration of the compose service `sl`: its `run --config` file with its
/// environment, loaded and validated as `sendledger run` does.
fn service_config(sl: &Yaml, dockerfile: &str) -> Config {
    assert_eq!(sl["build"].as_str(), Some("."));
    let args = strings(&sl["command"]);
    assert_eq!(args[0], "run");
    let config_path = repo_path(dockerfile, flag(&args, "--config"));
    let env: BTreeMap<String, String> = sl["environment"]
        .as_hash()
        .expect("environment is a map")
        .iter()
        .map(|(k, v)| {
            let v = v
                .as_str()
                .map(str::to_string)
                .or_else(|| v.as_i64().map(|n| n.to_string()))
                .unwrap_or_else(|| panic!("{k:?}: quote the value"));
            (k.as_str().unwrap().to_string(), resolve(&v))
        })
        .collect();
    Config::parse(&read(&config_path), &env)
        .unwrap_or_else(|e| panic!("{config_path} with the compose environment: {e:#}"))
}

/// The `kafka-mode` profile: two instances in kafka mode share one group and its topics, each
/// with its own ledger volume, static membership id and admin port; the events topic is
/// created keeping every event, with the requests topic's partition count.
#[test]
fn docker_compose_kafka_mode_profile_runs_two_instances_of_one_group() {
    use sendledger_node::config::StorageMode;
    let docs = YamlLoader::load_from_str(&read("docker-compose.yml")).expect("valid YAML");
    let services = &docs[0]["services"];
    let dockerfile = read("Dockerfile");
    let (a, b) = (&services["sendledger-a"], &services["sendledger-b"]);
    let (ca, cb) = (
        service_config(a, &dockerfile),
        service_config(b, &dockerfile),
    );
    for (sl, c) in [(a, &ca), (b, &cb)] {
        assert_eq!(strings(&sl["profiles"]), ["kafka-mode"]);
        assert_eq!(c.storage.mode, StorageMode::Kafka);
        assert_eq!(c.kafka.brokers, "kafka:9092");
        assert_eq!(
            sl["depends_on"]["topics-kafka-mode"]["condition"].as_str(),
            Some("service_completed_successfully")
        );
    }
    assert_eq!(ca.kafka.group_id, cb.kafka.group_id);
    assert_ne!(
        ca.kafka.group_id, "sendledger",
        "not the local-mode instance's group"
    );
    assert_eq!(ca.kafka.topics(), cb.kafka.topics());
    assert_ne!(ca.kafka.instance_id, cb.kafka.instance_id);
    assert_ne!(strings(&a["volumes"]), strings(&b["volumes"]));
    assert_ne!(strings(&a["ports"]), strings(&b["ports"]));

    let init = strings(&services["topics-kafka-mode"]["command"]).join(" ");
    assert_eq!(
        strings(&services["topics-kafka-mode"]["profiles"]),
        ["kafka-mode"]
    );
    for topic in ca.kafka.topics() {
        assert!(init.contains(topic), "topic {topic} is not created: {init}");
    }
    let events = init
        .split("&&")
        .find(|c| c.contains(&ca.kafka.events_topic))
        .unwrap();
    for setting in [
        "retention.ms=-1",
        "retention.bytes=-1",
        "cleanup.policy=delete",
    ] {
        assert!(events.contains(setting), "{events}");
    }
    assert_eq!(
        init.matches(&format!("--partitions {}", ca.kafka.partitions))
            .count(),
        2,
        "{init}"
    );
}

#[test]
fn docker_compose_agrees_with_the_config_format() {
    let docs = YamlLoader::load_from_str(&read("docker-compose.yml")).expect("valid YAML");
    let services = &docs[0]["services"];
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("ENTRYPOINT [\"sendledger\"]"));

    // The service: its config file with the compose environment is valid for this build.
    let sl = &services["sendledger"];
    let config = service_config(sl, &dockerfile);
    assert_eq!(config.kafka.brokers, "kafka:9092");
    assert!(config.storage.data.starts_with("/var/lib/sendledger"));
    let volume = strings(&sl["volumes"]);
    assert!(
        volume.iter().any(|v| v.ends_with(":/var/lib/sendledger")),
        "{volume:?}"
    );

    // The admin endpoint is published on the host's loopback only, on the configured port.
    let port = config.admin.listen.port();
    assert_eq!(
        strings(&sl["ports"]),
        vec![format!("127.0.0.1:{port}:{port}")]
    );
    assert!(config.admin.token.is_some(), "mutations need a token");

    // Every target points at the simulated remote, on the port it listens on.
    let sim = &services["sim"];
    let sim_args = strings(&sim["command"]);
    assert_eq!(sim_args[0], "sim-remote");
    let sim_port = flag(&sim_args, "--listen").rsplit(':').next().unwrap();
    let sim_config: SimConfig =
        toml::from_str(&read(&repo_path(&dockerfile, flag(&sim_args, "--config"))))
            .expect("the simulator's config parses");
    sim_config.validate().unwrap();
    for (name, target) in &config.targets {
        let base = format!("http://sim:{sim_port}{}", sim_config.create_path);
        assert!(
            target.url.starts_with(&base),
            "targets.{name}.url = {}",
            target.url
        );
        let lookup = target.lookup.as_ref().expect("a lookup");
        assert!(
            lookup
                .url
                .starts_with(&format!("http://sim:{sim_port}{}", sim_config.lookup_path)),
            "targets.{name}.lookup.url = {}",
            lookup.url
        );
    }

    // The topics created on start are the configured ones, with the configured partitions.
    let init = strings(&services["topics"]["command"]).join(" ");
    for topic in config.kafka.topics() {
        assert!(init.contains(topic), "topic {topic} is not created: {init}");
    }
    assert!(init.contains(&format!("--partitions {}", config.kafka.partitions)));
    assert!(init.contains(&format!(
        "--replication-factor {}",
        config.kafka.replication_factor
    )));
    let deps = &sl["depends_on"];
    assert_eq!(
        deps["topics"]["condition"].as_str(),
        Some("service_completed_successfully")
    );
    assert_eq!(
        services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"].as_str(),
        Some("broker,controller"),
        "single-node KRaft"
    );
}
