//! The JSON Schemas of the Kafka payloads (`schemas/`): the requests topic's schema accepts
//! exactly what the service accepts. (Every pipeline test validates the results and events it
//! reads back against theirs.)

use sendledger_tests::kafka::schema;

/// `schemas/task-request.schema.json` accepts exactly what the service accepts: every request
/// the tests produce validates, and each kind of bad request is refused by both.
#[test]
fn request_schema_agrees_with_the_service() {
    let validator = schema("task-request.schema.json");
    let good = serde_json::to_value(sendledger_tests::engine::request("k-1")).unwrap();
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        v
    };
    let cases = [
        (good.clone(), true),
        (
            with(&|v| v["metadata"] = serde_json::json!({"trace": "abc"})),
            true,
        ),
        (with(&|v| v["request_key"] = "ord:2024/77#a".into()), true),
        (
            with(&|v| {
                v.as_object_mut().unwrap().remove("tenant");
            }),
            false,
        ),
        (with(&|v| v["extra"] = 1.into()), false),
        (with(&|v| v["payload"] = serde_json::json!([1, 2])), false),
        (with(&|v| v["tenant"] = "".into()), false),
        (with(&|v| v["tenant"] = "has space".into()), false),
        (with(&|v| v["operation"] = "x".repeat(257).into()), false),
        (with(&|v| v["target"] = 7.into()), false),
        (
            with(&|v| v["metadata"] = serde_json::json!({"n": 1})),
            false,
        ),
    ];
    for (value, valid) in cases {
        let by_schema = validator.is_valid(&value);
        let by_service = sendledger_core::TaskRequest::from_json(value.to_string().as_bytes())
            .and_then(|r| r.accept(&sendledger_core::Limits::default()))
            .is_ok();
        assert_eq!(
            (by_schema, by_service),
            (valid, valid),
            "schema and service disagree on {value}"
        );
    }
}
