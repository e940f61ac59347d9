//! A headless Chromium driven through the DevTools protocol, for the console's browser tests
//! and screenshots. The protocol is JSON over one WebSocket: each command carries an id and is
//! answered by a message with that id; events (messages without an id) are skipped. One page
//! target is attached with `flatten`, so its commands go over the browser's socket with a
//! `sessionId`.
//!
//! Chromium comes from the distribution (`scripts/test` installs the `chromium` package when
//! missing). When it is not installed, [`Browser::launch`] panics saying so: a browser test
//! never passes without a browser.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// How long a page gets to show what a test waits for.
pub const PAGE_WAIT: Duration = Duration::from_secs(20);

/// A running headless Chromium with one page.
pub struct Browser {
    child: Child,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

/// The Chromium to run: `CHROMIUM` when set, else the first of the usual names on the PATH.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    let names = [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ];
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .flat_map(|dir| names.map(|name| dir.join(name)))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "Chromium is not installed, and the console's browser tests need it: run \
                 scripts/test (it installs the distribution's `chromium` package), or \
                 `apt-get install chromium`, or set CHROMIUM to a Chromium or Chrome binary"
            )
        })
}

impl Browser {
    /// Starts Chromium headless (without its sandbox, which refuses to run as root) with a
    /// fresh profile and a 1280×900 page.
    pub fn launch() -> Browser {
        let binary = chromium();
        let profile = tempfile::tempdir().expect("a profile directory");
        let child = Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let url = devtools_url(profile.path());
        let (socket, _) = tungstenite::connect(&url)
            .unwrap_or_else(|e| panic!("cannot connect to Chromium's DevTools at {url}: {e}"));
        let mut browser = Browser {
            child,
            socket,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = browser.send(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().expect("a target id").to_owned();
        let attached = browser.send(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_owned();
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
        );
        browser
    }

    /// One command, to the page (`session`) or the browser; its result. Panics on an error
    /// answer.
    fn send(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.try_send(session, method, params)
            .unwrap_or_else(|error| panic!("{method} failed: {error}"))
    }

    /// [`Browser::send`], with an error answer returned.
    fn try_send(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::text(command.to_string()))
            .unwrap_or_else(|e| panic!("sending {method}: {e}"));
        loop {
            let message = self
                .socket
                .read()
                .unwrap_or_else(|e| panic!("reading the answer to {method}: {e}"));
            let Message::Text(text) = message else {
                continue;
            };
            let answer: Value = serde_json::from_str(text.as_str()).expect("DevTools sends JSON");
            if answer["id"] != json!(id) {
                continue;
            }
            if let Some(error) = answer.get("error") {
                return Err(error.clone());
            }
            return Ok(answer["result"].clone());
        }
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(Some(&session), method, params)
    }

    /// Opens `url` and waits until the document has loaded.
    pub fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
        self.wait_for(&format!(
            "location.href === {} && document.readyState === 'complete'",
            json!(url)
        ));
    }

    /// Evaluates a JavaScript expression in the page (awaiting it when it is a promise); its
    /// value. Panics when it throws.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("`{expression}` threw: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// Polls `expression` until it is truthy; its value. Panics after [`PAGE_WAIT`] with what
    /// the page shows.
    pub fn wait_for(&mut self, expression: &str) -> Value {
        let deadline = Instant::now() + PAGE_WAIT;
        loop {
            let session = self.session.clone();
            let answer = self.try_send(
                Some(&session),
                "Runtime.evaluate",
                json!({
                    "expression": format!(
                        "(() => {{ try {{ return {expression}; }} catch (_) {{ return null; }} }})()"
                    ),
                    "returnByValue": true,
                    "awaitPromise": true,
                }),
            );
            // A page that is navigating (a form just submitted) has no context to evaluate in
            // yet: not shown yet.
            let value = match answer {
                Ok(result) => result["result"]["value"].clone(),
                Err(error)
                    if error["message"].as_str().is_some_and(|m| {
                        m.contains("navigated or closed") || m.contains("context")
                    }) =>
                {
                    Value::Null
                }
                Err(error) => panic!("Runtime.evaluate failed: {error}"),
            };
            if !matches!(value, Value::Null | Value::Bool(false))
                && value != json!(0)
                && value != json!("")
            {
                return value;
            }
            if Instant::now() > deadline {
                let text = self.eval("document.body ? document.body.innerText : ''");
                panic!("the page never showed `{expression}`; it shows:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The text of the first element matching a CSS selector (null when there is none).
    pub fn text(&mut self, selector: &str) -> Value {
        self.eval(&format!(
            "(document.querySelector({0}) || {{}}).textContent ?? null",
            json!(selector)
        ))
    }

    /// Sets a form field's value as typing would (an `input` event follows).
    pub fn fill(&mut self, selector: &str, value: &str) {
        self.eval(&format!(
            "(() => {{ const e = document.querySelector({0}); e.value = {1}; e.dispatchEvent(new Event('input', {{ bubbles: true }})); }})()",
            json!(selector),
            json!(value)
        ));
    }

    /// Clicks the first element matching a CSS selector.
    pub fn click(&mut self, selector: &str) {
        let found = self.eval(&format!(
            "(() => {{ const e = document.querySelector({0}); if (!e) return false; e.click(); return true; }})()",
            json!(selector)
        ));
        assert_eq!(found, json!(true), "no element {selector} to click");
    }

    /// Saves a PNG of the whole page (beyond the window when it is longer).
    pub fn screenshot(&mut self, path: &Path) {
        let shot = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        let data = shot["data"].as_str().expect("screenshot data");
        let png = base64_decode(data);
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The browser's DevTools WebSocket address, from the `DevToolsActivePort` file Chromium
/// writes in its profile once it listens (first line the port, second the path).
fn devtools_url(profile: &Path) -> String {
    let file = profile.join("DevToolsActivePort");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                return format!("ws://127.0.0.1:{port}{path}");
            }
        }
        assert!(
            Instant::now() < deadline,
            "Chromium did not open its DevTools port within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Standard base64 (the screenshot's encoding) to bytes.
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut count) = (0u32, 0);
    for byte in text
        .bytes()
        .filter(|b| *b != b'=' && !b.is_ascii_whitespace())
    {
        let value = ALPHABET
            .iter()
            .position(|c| *c == byte)
            .expect("base64 data") as u32;
        bits = (bits << 6) | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}
