//! Kafka over TLS and SASL: the main scenario with every client reaching Apache Kafka
//! through a TLS relay (a CA made at test time), and `sendledger run` with SCRAM settings
//! against brokers that refuse the login, its password kept out of every output.

use std::net::TcpListener;
use std::time::Duration;

use sendledger_kafka::Kafka;
use sendledger_tests::kafka::{config, embedded, end_to_end, Broker, TlsRelay};

/// The end-to-end scenario with Kafka over TLS (`security.protocol = ssl`): every client
/// (consumer, producers, admin) reaches Apache Kafka only through a TLS relay whose
/// certificate is signed by a CA made at test time and given as `ssl.ca.location`. Results
/// arrive on the topic and the remote holds one record per identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_to_end_over_tls_to_a_separate_broker() {
    let dir = tempfile::tempdir().unwrap();
    let ca = sendledger_tests::pki::Ca::new(dir.path(), "kafka");
    let broker_cert = ca.issue("broker", &["127.0.0.1", "localhost"]);
    let relay_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (broker, relay) = tokio::task::block_in_place(|| {
        let broker = Broker::single_advertising(relay_port);
        let relay = TlsRelay::start(relay_port, &broker_cert.cert, &broker_cert.key, broker.port);
        (broker, relay)
    });
    let mut kafka_config = config(&format!("127.0.0.1:{}", relay.port));
    for (k, v) in [
        ("security.protocol", "ssl".to_string()),
        ("ssl.ca.location", ca.ca_file().display().to_string()),
    ] {
        kafka_config.properties.insert(k.into(), v);
    }
    let kafka = Kafka::connect(kafka_config).unwrap();
    kafka
        .ensure_topics(1, Duration::from_secs(10), false)
        .await
        .expect("topics created over TLS");
    end_to_end(&kafka, 100, crate::seed(0x7150_0001)).await;
    drop(relay);
    drop(broker);
}

/// `sendledger run` with SCRAM-SHA-256 settings and its password given in the environment
/// (both spellings, `SASL_PASSWORD` and `SASL__PASSWORD`), against brokers that cannot
/// authenticate it (the embedded cluster of this test process offers no SASL): over
/// SASL_PLAINTEXT, and over SASL_SSL through a TLS relay. With sendledger's debug logs and
/// librdkafka's (`debug = all`) on, `run` stops at once with an error that says the brokers
/// refused it, librdkafka's reason (authentication, the mechanism) and the settings to check.
/// The password appears nowhere in its output; the configuration it logs shows `***`. (Without
/// the password set, librdkafka would refuse to create a SCRAM client at all, with another
/// error.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_password_never_appears_in_the_output_when_authentication_fails() {
    const PASSWORD: &str = "Xyzzy-9731-kept-out-of-logs";
    let kafka = embedded();
    let broker_port: u16 = kafka
        .bootstrap_servers()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = sendledger_tests::pki::Ca::new(dir.path(), "kafka");
    let broker_cert = ca.issue("broker", &["127.0.0.1", "localhost"]);
    let relay_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let relay = tokio::task::block_in_place(|| {
        TlsRelay::start(relay_port, &broker_cert.cert, &broker_cert.key, broker_port)
    });
    let runs = [
        ("sasl_plaintext", kafka.bootstrap_servers().to_string(), ""),
        ("sasl_ssl", format!("127.0.0.1:{}", relay.port), "ssl"),
    ];
    for (protocol, brokers, ssl) in &runs {
        for variable in [
            "SENDLEDGER__KAFKA__PROPERTIES__SASL_PASSWORD",
            "SENDLEDGER__KAFKA__PROPERTIES__SASL__PASSWORD",
        ] {
            let run_dir = tempfile::tempdir().unwrap();
            let file = run_dir.path().join("sendledger.toml");
            let ca_location = match *ssl {
                "ssl" => format!("\"ssl.ca.location\" = {:?}\n", ca.ca_file()),
                _ => String::new(),
            };
            std::fs::write(
                &file,
                format!(
                    "[storage]\ndata = {:?}\n[admin]\nenabled = false\n[kafka]\nbrokers = {brokers:?}\n\
                     [kafka.properties]\n\"security.protocol\" = \"{}\"\n\"sasl.mechanism\" = \"SCRAM-SHA-256\"\n\
                     \"sasl.username\" = \"sendledger\"\n\"debug\" = \"all\"\n{ca_location}\
                     [targets.p]\nurl = \"http://127.0.0.1:1/x\"\n",
                    run_dir.path().join("ledger"),
                    protocol.to_uppercase(),
                ),
            )
            .unwrap();
            let out = tokio::task::block_in_place(|| {
                crate::sendledger()
                    .args(["run", "--config"])
                    .arg(&file)
                    .env(variable, PASSWORD)
                    .env("RUST_LOG", "debug")
                    .output()
                    .unwrap()
            });
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let case = format!("{protocol} with {variable}");
            assert!(!stdout.contains(PASSWORD), "{case}: password on stdout");
            assert!(!stderr.contains(PASSWORD), "{case}: password on stderr");
            assert_eq!(out.status.code(), Some(1), "{case}:\n{stderr}");
            assert!(stdout.is_empty(), "{case}: never ready: {stdout}");
            // Debug logs were on: the configuration (secret shown as ***) and librdkafka's own.
            assert!(
                stderr.contains(r#""sasl.password": "***""#),
                "{case}: no configuration in the debug log"
            );
            assert!(stderr.contains("librdkafka"), "{case}: no librdkafka log");
            let error = stderr
                .lines()
                .find(|l| l.starts_with("error: "))
                .unwrap_or_else(|| panic!("{case}: no error line in:\n{stderr}"));
            for words in [
                "refused this client",
                "Authentication failure",
                &format!("{protocol}://{brokers}"),
                "SCRAM-SHA-256",
                "check the security settings in kafka.properties",
            ] {
                assert!(error.contains(words), "{case}: `{words}` not in: {error}");
            }
        }
    }
    drop(relay);
}
