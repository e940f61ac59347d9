//! The remote's answers: JSON bodies with their content type.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

pub(crate) type Resp = Response<Full<Bytes>>;

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn error_response(status: StatusCode, message: &str) -> Resp {
    json_response(status, &json!({ "error": message }))
}
