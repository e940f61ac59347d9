//! `schemas/front-door.openapi.json` checked against the front door itself: every answer the
//! front door tests get is looked up in the document by route and status, and its media type,
//! body and required headers must be what the document says; every request the front door
//! accepted must match its request body schema. The document's schemas refer to the Kafka
//! payloads' (`task-result.schema.json`, `task-request.schema.json`), so the HTTP result and
//! the Kafka result are one schema.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use super::Answer;

const BASE: &str = "https://sendledger.dev/schemas/";
const DOCUMENT: &str = "front-door.openapi.json";

struct OpenApi {
    doc: Value,
    /// Validators by JSON pointer into the document.
    validators: Mutex<BTreeMap<String, &'static jsonschema::Validator>>,
}

fn schema_file(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas")
        .join(name);
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn openapi() -> &'static OpenApi {
    static OPENAPI: OnceLock<OpenApi> = OnceLock::new();
    OPENAPI.get_or_init(|| OpenApi {
        doc: schema_file(DOCUMENT),
        validators: Mutex::new(BTreeMap::new()),
    })
}

/// A JSON pointer's token (`/` and `~` escaped).
fn token(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

impl OpenApi {
    /// The object at `pointer`, following a `$ref` to this document's components (the pointer
    /// then names where it led).
    fn resolve(&self, pointer: String) -> (String, &Value) {
        let value = (self.doc.pointer(&pointer))
            .unwrap_or_else(|| panic!("{DOCUMENT}: nothing at {pointer}"));
        match value.get("$ref").and_then(Value::as_str) {
            Some(r) if r.starts_with("#/components/") => self.resolve(r[1..].to_string()),
            _ => (pointer, value),
        }
    }

    /// The validator of the schema at `pointer` (its references resolved against the
    /// document's location, beside the Kafka payloads' schemas).
    fn validator(&self, pointer: &str) -> &'static jsonschema::Validator {
        let mut cache = self.validators.lock().unwrap_or_else(|e| e.into_inner());
        cache.entry(pointer.to_string()).or_insert_with(|| {
            let resource = |v: Value| jsonschema::Draft::Draft202012.create_resource(v);
            let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
            let root = serde_json::json!({ "$ref": format!("{BASE}{DOCUMENT}#{fragment}") });
            let validator = jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .with_resource(format!("{BASE}{DOCUMENT}"), resource(self.doc.clone()))
                .with_resource(
                    format!("{BASE}task-result.schema.json"),
                    resource(schema_file("task-result.schema.json")),
                )
                .with_resource(
                    format!("{BASE}task-request.schema.json"),
                    resource(schema_file("task-request.schema.json")),
                )
                .build(&root)
                .unwrap_or_else(|e| panic!("{DOCUMENT}#{pointer}: {e}"));
            Box::leak(Box::new(validator))
        })
    }

    /// The documented route of `path`, if any.
    fn route(path: &str) -> Option<&'static str> {
        let path = path.split('?').next().unwrap_or_default();
        match path {
            "/v1/tasks" => Some("/v1/tasks"),
            p if p.starts_with("/v1/tasks/") => Some("/v1/tasks/{id}"),
            _ => None,
        }
    }
}

/// Panics unless `answer`, to `method` on `path` with `body`, is what the document says.
pub fn check(method: &str, path: &str, body: Option<&Value>, answer: &Answer) {
    let api = openapi();
    let Some(route) = OpenApi::route(path) else {
        return;
    };
    let operation = format!("/paths/{}/{}", token(route), method.to_ascii_lowercase());
    let (_, op) = api.resolve(operation.clone());
    let status = answer.status.to_string();
    assert!(
        op["responses"].get(&status).is_some(),
        "{DOCUMENT}: {method} {route} does not document status {status}: {answer:?}"
    );
    let (response, documented) = api.resolve(format!("{operation}/responses/{status}"));
    if let Some(headers) = documented.get("headers").and_then(Value::as_object) {
        for (name, _) in headers {
            let (at, header) = api.resolve(format!("{response}/headers/{}", token(name)));
            let value = answer.header(&name.to_ascii_lowercase());
            if header["required"] == true {
                assert!(
                    value.is_some(),
                    "{DOCUMENT}: {method} {route} {status} must have {name}: {answer:?}"
                );
            }
            if let Some(value) = value {
                let value = Value::from(value);
                if let Err(e) = api.validator(&format!("{at}/schema")).validate(&value) {
                    panic!("{DOCUMENT}: header {name}: {e}: {answer:?}");
                }
            }
        }
    }
    if let Some(content) = documented.get("content").and_then(Value::as_object) {
        let media = answer.header("content-type").unwrap_or_default();
        assert!(
            content.contains_key(media),
            "{DOCUMENT}: {method} {route} {status} answers {:?}, not {media:?}: {answer:?}",
            content.keys().collect::<Vec<_>>()
        );
        let at = format!("{response}/content/{}/schema", token(media));
        if let Err(e) = api.validator(&at).validate(&answer.json()) {
            panic!("{DOCUMENT}: {method} {route} {status}: {e}: {answer:?}");
        }
    }
    if let (Some(body), 200..=299) = (body, answer.status) {
        let at = format!("{operation}/requestBody/content/application~1json/schema");
        if let Err(e) = api.validator(&at).validate(body) {
            panic!("{DOCUMENT}: an accepted {method} {route} body: {e}: {body}");
        }
    }
}

/// The document is OpenAPI 3.1, and every schema it holds (with every reference in it to this
/// document and to the Kafka payloads' schemas) compiles.
#[test]
fn the_openapi_document_is_3_1_and_every_schema_in_it_resolves() {
    let api = openapi();
    assert_eq!(api.doc["openapi"], "3.1.0");
    assert!(api.doc["info"]["title"].is_string() && api.doc["info"]["version"].is_string());
    let mut schemas = 0;
    for (path, item) in api.doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            let operation = format!("/paths/{}/{method}", token(path));
            let (_, op) = api.resolve(operation.clone());
            for (status, _) in op["responses"].as_object().unwrap() {
                let (response, documented) = api.resolve(format!("{operation}/responses/{status}"));
                assert!(documented["description"].is_string(), "{response}");
                for (media, _) in documented
                    .get("content")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                {
                    api.validator(&format!("{response}/content/{}/schema", token(media)));
                    schemas += 1;
                }
            }
            if op.get("requestBody").is_some() {
                api.validator(&format!(
                    "{operation}/requestBody/content/application~1json/schema"
                ));
                schemas += 1;
            }
        }
    }
    assert!(schemas >= 10, "{schemas}");
    // The shared result schema is the Kafka one: a result record from the fixtures validates.
    let pending = api.validator("/components/schemas/Pending");
    let example =
        serde_json::json!({ "task_id": "0".repeat(32), "state": "unknown", "result": null });
    assert!(pending.validate(&example).is_ok());
    let wrong = serde_json::json!({ "task_id": "x", "state": "lost", "result": null });
    assert!(pending.validate(&wrong).is_err());
}
