//! Problem details (RFC 9457): the front door's error answers, `application/problem+json`.

use axum::response::{IntoResponse, Response};
use http::{header, StatusCode};
use sendledger_core::TaskId;
use serde_json::json;

/// One problem: its status, a stable kind (the `type` is `urn:sendledger:problem:<kind>`), a
/// short title, and what happened in this case.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: Option<String>,
    location: Option<TaskId>,
    retry_after: bool,
    challenge: bool,
}

impl Problem {
    pub fn new(status: StatusCode, kind: &'static str, title: &'static str) -> Problem {
        Problem {
            status,
            kind,
            title,
            detail: None,
            location: None,
            retry_after: false,
            challenge: false,
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Problem {
        self.detail = Some(detail.into());
        self
    }

    /// Names the task the problem is about, with `Location` and a `task_id` member.
    pub fn location(mut self, task: TaskId) -> Problem {
        self.location = Some(task);
        self
    }

    /// Asks the client to try again after a second.
    pub fn retry_after(mut self) -> Problem {
        self.retry_after = true;
        self
    }
}

impl Problem {
    /// Asks the client for a bearer token (`WWW-Authenticate`, RFC 6750).
    pub fn challenge(mut self) -> Problem {
        self.challenge = true;
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": format!("urn:sendledger:problem:{}", self.kind),
            "title": self.title,
            "status": self.status.as_u16(),
        });
        if let Some(detail) = &self.detail {
            body["detail"] = json!(detail);
        }
        if let Some(task) = self.location {
            body["task_id"] = json!(task.to_string());
        }
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body.to_string(),
        )
            .into_response();
        let headers = response.headers_mut();
        if let Some(task) = self.location {
            if let Ok(value) = format!("/v1/tasks/{task}").parse() {
                headers.insert(header::LOCATION, value);
            }
        }
        if self.challenge {
            headers.insert(
                header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"sendledger\""),
            );
        }
        if self.retry_after {
            headers.insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        }
        response
    }
}
