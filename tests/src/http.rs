//! HTTP as the tests speak it to the admin endpoint and the simulated remote: one request on a
//! fresh connection, closed by the server after its answer.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The admin token the tests configure where they need one.
pub const TOKEN: &str = "s3cret-admin-token";

/// One HTTP/1.1 request on a fresh connection; the status and the body.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    stream.read_to_string(&mut resp).await.unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("a full response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// `GET path`, which must answer 200 with JSON.
pub async fn get_json(addr: &str, path: &str) -> Value {
    let (status, body) = request(addr, "GET", path, None, None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// `POST /reviews/{task}`; the status and the JSON answer.
pub async fn resolve(addr: &str, task: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let (status, body) =
        request(addr, "POST", &format!("/reviews/{task}"), token, Some(body)).await;
    (status, serde_json::from_str(&body).expect("a JSON answer"))
}

/// The body of `GET path` when it answered 200 within `timeout`, blocking; `None` otherwise
/// (no connection, no answer, another status).
pub fn get(addr: &str, path: &str, timeout: Duration) -> Option<String> {
    get_any(addr, path, timeout).and_then(|(status, body)| (status == 200).then_some(body))
}

/// The status and body of `GET path` when it was answered within `timeout`, blocking.
pub fn get_any(addr: &str, path: &str, timeout: Duration) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect_timeout(&addr.parse().ok()?, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    Some((status, body.to_string()))
}
