//! Lookups that follow pages (`lookup.paging`), over real sockets against the simulated remote
//! in each of its paging styles, and against a scripted remote for the pages that cannot be
//! followed: every page's matches count, and a lookup that cannot read every page is an
//! error, never a result of zero or one match.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sendledger_core::{AcceptedRequest, Evidence, Phase, TaskRequest};
use sendledger_effects::{Error, Target, TargetConfig};
use sendledger_sim::{Faults, LookupPaging, Sim, SimConfig};
use sendledger_tests::effects::{config, request, start_sim, target};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const STYLES: [LookupPaging; 3] = [LookupPaging::Body, LookupPaging::Link, LookupPaging::Offset];

/// A simulated remote answering lookups in pages of at most `size` records, led to as `style`
/// says.
async fn paged_sim(size: usize, style: LookupPaging) -> Sim {
    Sim::start(SimConfig {
        lookup_page_size: Some(size),
        lookup_paging: style,
        ..SimConfig::default()
    })
    .await
    .expect("sim starts")
}

/// The `lookup` key of a target reading `sim`'s pages in `style`: `GET <lookup>?<query>`, the
/// records where `style` puts them, `more` added to the lookup table and `paging` to its
/// paging table (each `, key = value...` or empty).
fn lookup(sim: &Sim, style: LookupPaging, query: &str, more: &str, paging: &str) -> String {
    let (results, follow) = match style {
        LookupPaging::Body => ("/items", r#"next_pointer = "/next""#),
        LookupPaging::Link => ("", "link = true"),
        LookupPaging::Offset => ("", r#"page_param = "page""#),
    };
    format!(
        r#"lookup = {{ url = "{url}?{query}", results_pointer = "{results}", paging = {{ {follow}{paging} }}{more} }}"#,
        url = sim.lookup_url()
    )
}

/// The lookup key for the task's own records (`reference={task_id}`).
fn by_task(sim: &Sim, style: LookupPaging, paging: &str) -> String {
    lookup(sim, style, "reference={task_id}", "", paging)
}

/// The sim's record ids of the request key `key`, in creation order.
fn ids_of(sim: &Sim, key: &str) -> Vec<String> {
    sim.records_with_identity(key)
        .into_iter()
        .map(|r| r.id)
        .collect()
}

/// Two records of one task with pages of one record: the second is on page 2, and the lookup
/// returns both (a duplicate: manual review), not the first alone (a confirmation).
#[tokio::test]
async fn a_duplicate_on_page_2_is_found_in_every_style() {
    for style in STYLES {
        let sim = paged_sim(1, style).await;
        let target = target(&sim, &by_task(&sim, style, ""));
        let req = request("ord-1", json!({"amount": 1250}));
        target.execute(&req, 1, None).await;
        target.execute(&req, 2, None).await;
        let records = ids_of(&sim, "ord-1");
        assert_eq!(records.len(), 2, "{style:?}");
        let found = target.lookup(&req, None).await;
        assert_eq!(found, Ok(records), "{style:?}");
    }
}

/// The lookup asks by account (records of other orders too) and keeps the task's order: its
/// record, third in the account, is found on page 3.
#[tokio::test]
async fn the_tasks_own_record_on_page_3_is_found_in_every_style() {
    for style in STYLES {
        let sim = paged_sim(1, style).await;
        let by_account = lookup(
            &sim,
            style,
            "account={payload.account}",
            r#", filters = { "/body/order" = "/order" }"#,
            "",
        );
        let target = target(&sim, &by_account);
        let order = |key: &str| request(key, json!({"account": "acc-1", "order": key}));
        for key in ["o-1", "o-2", "o-3"] {
            target.execute(&order(key), 1, None).await;
        }
        let found = target.lookup(&order("o-3"), None).await;
        assert_eq!(found, Ok(ids_of(&sim, "o-3")), "{style:?}");
        assert_eq!(found.unwrap().len(), 1);
    }
}

/// A sim in pages of `size` holding three records of the task `ord-1`, with the request.
async fn three_records(size: usize, style: LookupPaging) -> (Sim, AcceptedRequest) {
    let sim = paged_sim(size, style).await;
    let req = request("ord-1", json!({}));
    let writer = target(&sim, "");
    for attempt in 1..=3 {
        writer.execute(&req, attempt, None).await;
    }
    (sim, req)
}

/// Three records in pages of one and a cap of two pages: the record past the cap could be a
/// duplicate, so the lookup fails, naming the cap; with room for every page it finds all
/// three. Numbered pages end at a page shorter than the remote's pages: the empty fourth here.
#[tokio::test]
async fn an_answer_longer_than_max_pages_is_an_error_naming_the_cap() {
    for style in STYLES {
        let (sim, req) = three_records(1, style).await;
        let capped = target(&sim, &by_task(&sim, style, ", max_pages = 2"));
        match capped.lookup(&req, None).await {
            Err(err @ Error::LookupPaging { page: 2, .. }) => {
                let text = err.to_string();
                assert!(text.contains("lookup.paging.max_pages (2)"), "{text}");
                assert!(!err.is_transient());
            }
            other => panic!("{style:?}: expected an error at the cap, got {other:?}"),
        }
        let room = match style {
            LookupPaging::Offset => ", max_pages = 4",
            LookupPaging::Body | LookupPaging::Link => ", max_pages = 3",
        };
        let found = target(&sim, &by_task(&sim, style, room))
            .lookup(&req, None)
            .await;
        assert_eq!(found, Ok(ids_of(&sim, "ord-1")), "{style:?}");
    }
}

/// Numbered pages of two: the second page holds one record. Without `page_size` only an empty
/// (third) page ends the answer, past a cap of two; with `page_size = 2` the short second
/// page is known to be the last.
#[tokio::test]
async fn page_size_ends_numbered_pages_at_a_short_page() {
    let (sim, req) = three_records(2, LookupPaging::Offset).await;
    let lookup = |paging: &str| by_task(&sim, LookupPaging::Offset, paging);
    let err = target(&sim, &lookup(", max_pages = 2"))
        .lookup(&req, None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LookupPaging { page: 2, .. }), "{err}");
    let found = target(&sim, &lookup(", max_pages = 2, page_size = 2"))
        .lookup(&req, None)
        .await;
    assert_eq!(found, Ok(ids_of(&sim, "ord-1")));
    assert_eq!(found.unwrap().len(), 3);
}

/// One answer of the scripted remote: status, headers and body; `None` closes the connection
/// unanswered.
type Answer = Option<(u16, Vec<(&'static str, String)>, String)>;

/// A remote that answers each request as `answer` says for its path and query (one request
/// per connection), and the paths asked, in order.
struct Scripted {
    base: String,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    async fn start(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Scripted {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(answer);
        let log = asked.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, log) = (answer.clone(), log.clone());
                tokio::spawn(async move {
                    let mut reader = BufReader::new(stream);
                    let mut line = String::new();
                    reader.read_line(&mut line).await.unwrap();
                    let Some(path) = line.split_whitespace().nth(1).map(str::to_string) else {
                        return; // closed before a request
                    };
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).await.unwrap();
                        if header == "\r\n" {
                            break;
                        }
                    }
                    log.lock().unwrap().push(path.clone());
                    let Some((status, headers, body)) = answer(&path) else {
                        return;
                    };
                    let mut head = format!(
                        "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                        body.len()
                    );
                    for (name, value) in headers {
                        head.push_str(&format!("{name}: {value}\r\n"));
                    }
                    let stream = reader.get_mut();
                    stream
                        .write_all(format!("{head}\r\n{body}").as_bytes())
                        .await
                        .unwrap();
                    stream.shutdown().await.unwrap();
                });
            }
        });
        Scripted { base, asked }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }

    /// A target looking the task up at this remote by reference (and `query`, `&name=value`
    /// or empty), with `lookup` keys added (`, key = value...`) and a bearer token in its
    /// headers.
    fn target(&self, query: &str, lookup: &str) -> Target {
        let config: TargetConfig = toml::from_str(&format!(
            r#"
url = "{base}/records"
request_timeout = "3s"
headers = {{ authorization = "Bearer {TOKEN}" }}
body_fields = {{ reference = "{{task_id}}" }}
lookup = {{ url = "{base}/records?reference={{task_id}}{query}"{lookup} }}
"#,
            base = self.base
        ))
        .unwrap();
        Target::from_config("payments", &config).unwrap()
    }
}

/// A page answer with one record and `next` in the body.
fn page(id: &str, next: serde_json::Value) -> Answer {
    let body = json!({"items": [{"id": id}], "next": next});
    Some((200, vec![], body.to_string()))
}

const BODY_PAGES: &str = r#", results_pointer = "/items", paging = { next_pointer = "/next" }"#;
const TOKEN: &str = "s3cret-lookup-token";

/// A next page on another port or host is never asked (the target's headers would go there):
/// the lookup fails after page 1, whether the link is in the body or the `Link` header, and
/// the error does not quote the token the remote echoed into the link.
#[tokio::test]
async fn a_next_page_elsewhere_is_an_error_and_is_never_asked() {
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = format!(
        "http://{}/records?page=2&token={TOKEN}",
        other.local_addr().unwrap()
    );
    let remote = Scripted::start(move |path| {
        if path.contains("style=link") {
            let header = ("link", format!("<{link}>; rel=\"next\""));
            Some((200, vec![header], json!([{"id": "r-1"}]).to_string()))
        } else {
            page("r-1", json!(link))
        }
    })
    .await;
    let req = request("ord-1", json!({}));
    for (query, lookup) in [
        ("&style=body", BODY_PAGES),
        ("&style=link", ", paging = { link = true }"),
    ] {
        let target = remote.target(query, lookup);
        let err = target.lookup(&req, None).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::LookupPaging { page: 1, .. }), "{text}");
        assert!(
            text.contains("is not on the lookup's scheme, host and port"),
            "{text}"
        );
        assert!(!text.contains(TOKEN), "token leaked: {text}");
    }
    assert_eq!(remote.asked().len(), 2, "{:?}", remote.asked());
    assert!(remote.asked().iter().all(|p| !p.contains("page=2")));
    let connected = tokio::time::timeout(Duration::from_millis(200), other.accept()).await;
    assert!(connected.is_err(), "a page was asked at the other host");
}

/// Page 1 leads on to page 2 by a path on the same remote; page 2 fails (503, an answer that
/// is not JSON, no answer, a next URL that is a number): the lookup is an error naming page 2,
/// whatever page 1 held, and a 503 or no answer may pass when asked again.
#[tokio::test]
async fn a_page_that_fails_fails_the_lookup_naming_the_page() {
    type Second = fn() -> Answer;
    let cases: [(Second, &str, bool); 4] = [
        (
            || Some((503, vec![], "{\"error\": \"busy\"}".into())),
            "answered 503",
            true,
        ),
        (|| Some((200, vec![], "<html>".into())), "not JSON", false),
        (|| None, "failed", true),
        (|| page("r-2", json!(3)), "is a number, not a string", false),
    ];
    for (second, expected, transient) in cases {
        let remote = Scripted::start(move |path| {
            if path.contains("page=2") {
                second()
            } else {
                page("r-1", json!("/records?page=2"))
            }
        })
        .await;
        let target = remote.target("", BODY_PAGES);
        let err = target
            .lookup(&request("ord-1", json!({})), None)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(expected), "{text}");
        assert!(text.contains("page 2"), "{text}");
        assert_eq!(err.is_transient(), transient, "{text}");
        assert_eq!(remote.asked().len(), 2, "{:?}", remote.asked());
        assert_eq!(remote.asked()[1], "/records?page=2");
    }
}

/// Settings a lookup could not follow are refused when the target is loaded, naming the field.
#[tokio::test]
async fn paging_settings_that_cannot_work_are_refused_naming_the_field() {
    let sim = start_sim(Faults::default()).await;
    let url = format!("{}?reference={{task_id}}", sim.lookup_url());
    let refused = |lookup: &str| {
        let cfg = config(&sim, &format!(r#"lookup = {{ url = "{url}"{lookup} }}"#));
        match Target::from_config("payments", &cfg) {
            Err(Error::Config { field, reason }) => (field, reason),
            other => panic!("{lookup}: expected a configuration error, got {other:?}"),
        }
    };
    let field = |name: &str| format!("targets.payments.lookup.paging{name}");
    for (lookup, at, says) in [
        (
            r#", results_pointer = "/items", paging = { next_pointer = "/next", link = true }"#,
            field(""),
            "sets next_pointer and link",
        ),
        (
            ", paging = { link = true, page_param = \"page\" }",
            field(""),
            "sets link and page_param",
        ),
        (
            ", paging = { max_pages = 3 }",
            field(""),
            "no way to the next page",
        ),
        (
            ", paging = { link = true, max_pages = 0 }",
            field(".max_pages"),
            "at least 1",
        ),
        (
            r#", results_pointer = "/items", paging = { next_pointer = "next" }"#,
            field(".next_pointer"),
            "is not a JSON pointer",
        ),
        (
            r#", paging = { next_pointer = "/next" }"#,
            field(".next_pointer"),
            "must point beside the records",
        ),
        (
            ", paging = { link = true, page_size = 10 }",
            field(".page_size"),
            "page_param only",
        ),
        (
            ", paging = { link = true, first_page = 0 }",
            field(".first_page"),
            "page_param only",
        ),
        (
            ", paging = { page_param = \"page\", page_size = 0 }",
            field(".page_size"),
            "at least 1",
        ),
        (
            ", paging = { page_param = \"pa ge\" }",
            field(".page_param"),
            "not a query parameter name",
        ),
    ] {
        let (field, reason) = refused(lookup);
        assert_eq!(field, at, "{lookup}: {reason}");
        assert!(reason.contains(says), "{lookup}: {reason}");
    }
    let cfg = config(
        &sim,
        &format!(r#"lookup = {{ url = "{url}&page=1", paging = {{ page_param = "page" }} }}"#),
    );
    match Target::from_config("payments", &cfg) {
        Err(Error::Config { field: f, reason }) => {
            assert_eq!(f, field(".page_param"));
            assert!(
                reason.contains("already has a `page` parameter"),
                "{reason}"
            );
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

/// The engine end to end: the remote holds two orders of the account, then commits the task's
/// and drops the answer. The lookup asks by account in pages of one record and finds the
/// task's record on page 3: confirmed with that record's id, never resent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_confirms_a_dropped_answer_by_a_record_on_page_3() {
    use sendledger_tests::engine::{self, settled, source, task_id, wait_for};

    let sim = paged_sim(1, LookupPaging::Body).await;
    let base = sim.base_url();
    let config = engine::target(&base, |t| {
        t["lookup"]["url"] = format!("{base}/records?account={{payload.account}}").into();
        t["lookup"]["results_pointer"] = "/items".into();
        t["lookup"]["filters"] = json!({"/body/order": "/order"});
        t["lookup"]["paging"] = json!({"next_pointer": "/next"});
    });
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| engine::start(dir.path(), config));
    let order = |key: &str| TaskRequest {
        payload: json!({"account": "acc-1", "order": key}),
        ..engine::request(key)
    };
    for (offset, key) in ["o-1", "o-2"].into_iter().enumerate() {
        engine
            .submit(order(key), source(offset as i64))
            .await
            .unwrap();
        let state = wait_for(&engine, task_id(key), Duration::from_secs(20), settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
    }
    sim.set_faults(Faults {
        commit_then_drop: 1.0,
        ..Faults::default()
    })
    .unwrap();
    engine.submit(order("o-3"), source(2)).await.unwrap();
    let state = wait_for(&engine, task_id("o-3"), Duration::from_secs(20), settled).await;
    let records = ids_of(&sim, "o-3");
    assert_eq!(records.len(), 1);
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.evidence, Some(Evidence::Lookup));
    assert_eq!(state.remote_id.as_deref(), Some(records[0].as_str()));
    assert_eq!(state.attempts, 1);
    assert_eq!(sim.stats().dropped, 1);
    engine.shutdown(Duration::from_secs(5)).await;
}
