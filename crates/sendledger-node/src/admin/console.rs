//! The review console: HTML pages served by the admin endpoint under `/console`, for people
//! on call. The pages are static (shipped in the binary with `include_str!`, nothing fetched
//! from elsewhere); their scripts read the endpoint's JSON routes (`/reviews`, `/tasks`,
//! `/tasks/{id}`, `/healthz`, `/metrics`), resolve reviews with `POST /reviews/{id}` and retry
//! failed tasks with `POST /tasks/retry`, so the console can do
//! nothing the endpoint does not already allow, and changes need the same token.
//!
//! | route | what |
//! |---|---|
//! | `GET /console` | the review queue: every task in manual review, sortable and filterable |
//! | `GET /console/task/{id}` | one task: request, remote ids seen, timeline, and the resolve form while in review (404 page for a task not in the ledger) |
//! | `GET /console/tasks` | tasks by phase, target, failure kind and time (`/tasks`), each target's breaker (`/healthz`), and for failed tasks the form that retries them in bulk (`POST /tasks/retry`) |
//! | `GET /console/dashboard` | charts of the `/metrics` numbers: tasks by state, unknowns, attempts, lookups, consumer lag |
//! | `GET /console/assets/{name}` | the pages' stylesheet and scripts |
//!
//! The pages never interpolate data into HTML: the server sends the same page for every task
//! (the script reads the id from the address) and the scripts insert data as text. The
//! Content-Security-Policy allows scripts from the endpoint only, never inline ones, so markup
//! that slipped into a page could not run either.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode, Uri};
use sendledger_core::error::Chain;

use super::tasks::task_ref;
use super::Shared;

/// `GET /console` and everything under it: a console page or asset; a task page only for a
/// task in the ledger, so a mistyped id gets a 404 page rather than an empty one. The path is
/// read as it came (a task reference is one percent-encoded segment).
pub async fn route(State(shared): State<Arc<Shared>>, uri: Uri) -> Response {
    let path = uri.path().trim_matches('/');
    let rest: Vec<&str> = path.split('/').skip(1).collect();
    match rest.as_slice() {
        ["assets", name] => asset(name),
        ["task", segment] if !segment.is_empty() => {
            let Ok(task_id) = task_ref(segment) else {
                return error_page(
                    StatusCode::BAD_REQUEST,
                    "This is not a task reference: use a task id (32 hex digits) or tenant/operation/request_key URL-encoded.",
                );
            };
            if shared.gate.reads_need_credential() {
                // Whether the task exists is for those who may read it: the page's script
                // asks with the operator's token.
                return page(Page::Task);
            }
            match shared.engine.events(task_id).await {
                Ok(events) if events.is_empty() => error_page(
                    StatusCode::NOT_FOUND,
                    "No such task: the ledger holds no event of it.",
                ),
                Ok(_) => page(Page::Task),
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "console: cannot read a task");
                    error_page(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The task cannot be read now; the service's log says why.",
                    )
                }
            }
        }
        _ => match page_of(&rest) {
            Some(p) => page(p),
            None => error_page(StatusCode::NOT_FOUND, "No such console page."),
        },
    }
}

/// One of the console's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Page {
    Queue,
    Task,
    Tasks,
    Dashboard,
}

impl Page {
    /// The page's title and its script (besides the shared `console.js`).
    fn parts(self) -> (&'static str, &'static str) {
        match self {
            Page::Queue => ("Review queue", "queue.js"),
            Page::Task => ("Task", "task.js"),
            Page::Tasks => ("Tasks", "tasks.js"),
            Page::Dashboard => ("Dashboard", "dashboard.js"),
        }
    }
}

/// The page of a console path (the segments after `console`), if it names one.
fn page_of(rest: &[&str]) -> Option<Page> {
    match rest {
        [] | [""] => Some(Page::Queue),
        ["dashboard"] => Some(Page::Dashboard),
        ["tasks"] => Some(Page::Tasks),
        ["task", id] if !id.is_empty() => Some(Page::Task),
        _ => None,
    }
}

/// The files under `/console/assets/`: name, content type, content.
const ASSETS: [(&str, &str, &str); 6] = [
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../../console/console.css"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/console.js"),
    ),
    (
        "queue.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/queue.js"),
    ),
    (
        "task.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/task.js"),
    ),
    (
        "tasks.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/tasks.js"),
    ),
    (
        "dashboard.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/dashboard.js"),
    ),
];

/// The shell every page shares; `{title}` and `{scripts}` are ours, never data.
const SHELL: &str = include_str!("../../console/page.html");

/// An asset by name, or a 404.
fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => response(
            StatusCode::OK,
            content_type,
            Bytes::from_static(body.as_bytes()),
        ),
        None => error_page(StatusCode::NOT_FOUND, "No such console asset."),
    }
}

/// A page's HTML: the shell with its title and script.
fn page(page: Page) -> Response {
    let (title, script) = page.parts();
    let html = SHELL.replace("{title}", title).replace(
        "{scripts}",
        &format!("<script src=\"/console/assets/{script}\"></script>"),
    );
    response(
        StatusCode::OK,
        "text/html; charset=utf-8",
        Bytes::from(html),
    )
}

/// An error as a console page: `message` is ours (fixed text), never data from a request.
fn error_page(status: StatusCode, message: &'static str) -> Response {
    let html = SHELL
        .replace("{title}", status.canonical_reason().unwrap_or("Error"))
        .replace(
            "<main id=\"main\"></main>",
            &format!("<main id=\"main\"><p class=\"error\" id=\"page-error\">{message}</p></main>"),
        )
        .replace("{scripts}", "");
    response(status, "text/html; charset=utf-8", Bytes::from(html))
}

/// A response with the console's headers: scripts and styles from this endpoint only, no
/// framing, no sniffing, no referrer (task ids are in the addresses).
fn response(status: StatusCode, content_type: &str, body: Bytes) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    if let Ok(value) = HeaderValue::from_str(content_type) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_paths_name_their_pages() {
        assert_eq!(page_of(&[]), Some(Page::Queue));
        assert_eq!(page_of(&[""]), Some(Page::Queue));
        assert_eq!(page_of(&["dashboard"]), Some(Page::Dashboard));
        assert_eq!(page_of(&["task", "abc"]), Some(Page::Task));
        assert_eq!(page_of(&["task", ""]), None);
        assert_eq!(page_of(&["tasks"]), Some(Page::Tasks));
        assert_eq!(page_of(&["tasks", "x"]), None);
    }

    /// Every page loads the shared script and its own, and every script it names is served.
    #[test]
    fn pages_name_served_scripts() {
        for p in [Page::Queue, Page::Task, Page::Tasks, Page::Dashboard] {
            let (_, script) = p.parts();
            assert!(ASSETS.iter().any(|(n, _, _)| *n == script), "{script}");
        }
        assert!(SHELL.contains("/console/assets/console.js"));
        assert!(SHELL.contains("<main id=\"main\"></main>"));
    }
}
