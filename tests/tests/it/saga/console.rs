//! A saga in the review console, in a real browser (headless Chromium) against the admin
//! tests' service child: the task page shows the steps, and an operator keeps the charge that
//! is the order's and orders the other one the lookup found undone. The ledger records the
//! order with the operator's name, the refund reaches the remote, and the page shows the
//! duplicate undone and the order succeeded.

use std::time::Duration;

use sendledger_sim::Faults;
use sendledger_tests::browser::Browser;
use sendledger_tests::engine::*;
use sendledger_tests::http::{get_json, TOKEN};
use sendledger_tests::process::AdminChild;
use serde_json::{json, Value};

use super::{sagas, Remotes};

/// Polls `GET /tasks/{key}` until the task is in `state`.
async fn wait_task(addr: &str, key: &str, state: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let task = get_json(addr, &format!("/tasks/{}", task_ref(key))).await;
        if task["state"] == state {
            return task;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{key} never {state}: {task}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_a_sagas_steps_and_orders_a_duplicate_undone() {
    let remotes = Remotes::start(|_| Faults::default()).await;
    let earlier_charge = remotes.charged_elsewhere("con-1").await;
    let dir = tempfile::tempdir().unwrap();
    let setup = json!({ "targets": remotes.configs(), "sagas": sagas(), "target": "order" });
    let mut service = tokio::task::block_in_place(|| {
        AdminChild::start(
            crate::ADMIN_CHILD,
            dir.path(),
            &setup.to_string(),
            None,
            TOKEN,
        )
    });
    tokio::task::block_in_place(|| service.submit("con-1"));
    let addr = service.addr.clone();
    let task = wait_task(&addr, "con-1", "manual_review").await;
    remotes.payments.set_faults(Faults::default()).unwrap();
    let found: Vec<String> = task["remote_ids_seen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["remote_id"].as_str().unwrap().to_string())
        .collect();
    let ours = remotes
        .payments
        .records_with_identity("con-1")
        .into_iter()
        .map(|r| r.id)
        .find(|id| *id != earlier_charge)
        .unwrap();
    assert!(
        found.contains(&ours) && found.contains(&earlier_charge),
        "the page lists both records the lookup found: {found:?}"
    );

    let mut browser = tokio::task::block_in_place(Browser::launch);
    tokio::task::block_in_place(|| {
        browser.goto(&format!("http://{addr}/console/task/{}", task_ref("con-1")));
        browser.wait_for("document.querySelector('#steps')");
        let row = |browser: &mut Browser, step: &str| {
            browser
                .text(&format!("#steps tr[data-step='{step}']"))
                .as_str()
                .unwrap()
                .to_string()
        };
        let reserve = row(&mut browser, "reserve");
        assert!(reserve.contains("succeeded"), "{reserve}");
        let charge = row(&mut browser, "charge");
        assert!(charge.contains("this step's call now"), "{charge}");
        assert!(row(&mut browser, "ship").contains("pending"));

        crate::console::sign_in(&mut browser, TOKEN);
        browser.wait_for("document.querySelector('#resolve-form')");
        browser.click("#as-succeeded");
        browser.fill("#remote-id", &ours);
        browser.fill("#undo", &earlier_charge);
        browser.fill("#by", "Ada Operator");
        browser.fill("#reason", "the customer was charged twice");
        browser.click("#review");
        let says = browser.wait_for("document.querySelector('#preview-says').textContent");
        let says = says.as_str().unwrap();
        assert!(
            says.contains(&earlier_charge) && says.contains("undone"),
            "{says}"
        );
        let body = browser.text("#preview-body");
        assert!(body.as_str().unwrap().contains("\"undo\""), "{body}");
        browser.click("#send");
        browser.wait_for("document.querySelector('#result').dataset.status === '200'");
    });
    wait_task(&addr, "con-1", "succeeded").await;
    let refunds = remotes.refunds.records_with_identity("con-1");
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0].body["undoes"], earlier_charge.as_str());
    assert_eq!(remotes.shipments.records_with_identity("con-1").len(), 1);

    let task = get_json(&addr, &format!("/tasks/{}", task_ref("con-1"))).await;
    let ordered = task["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "CompensationOrdered")
        .expect("the order is in the ledger");
    assert_eq!(ordered["data"]["by"], "Ada Operator");
    tokio::task::block_in_place(|| {
        browser.goto(&format!("http://{addr}/console/task/{}", task_ref("con-1")));
        browser.wait_for("document.querySelector('#task-state').textContent === 'succeeded'");
        let duplicates = browser.text("#steps tr[data-step='charge'] .duplicates");
        let duplicates = duplicates.as_str().unwrap();
        assert!(
            duplicates.starts_with("done") && duplicates.contains(&earlier_charge),
            "{duplicates}"
        );
        assert!(duplicates.contains("Ada Operator"), "{duplicates}");
    });
    tokio::task::block_in_place(|| service.stop());
}
