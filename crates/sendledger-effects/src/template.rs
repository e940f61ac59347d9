//! `{field}` templates over a request: URLs and body fields.
//!
//! Placeholders: `{tenant}`, `{operation}`, `{request_key}`, `{task_id}`, `{target}`,
//! `{metadata.KEY}` and `{payload.a.b}` (a dotted path into the payload; the value must be a
//! string, number or boolean). `{{` and `}}` are literal braces.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sendledger_core::AcceptedRequest;
use serde_json::Value;

/// Everything except RFC 3986 unreserved characters is encoded: safe in a path segment and in
/// a query value.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Tenant,
    Operation,
    RequestKey,
    TaskId,
    Target,
    Metadata(String),
    Payload(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(Field),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    source: String,
    parts: Vec<Part>,
}

impl Template {
    /// Parses a template; the error says what is wrong, for the caller to prefix with the field.
    pub(crate) fn parse(source: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some('{') | None => {
                                return Err(format!("unclosed placeholder `{{{name}`"))
                            }
                            Some(c) => name.push(c),
                        }
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(field(&name)?));
                }
                '}' => return Err("unmatched `}` (write `}}` for a literal brace)".into()),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template {
            source: source.to_string(),
            parts,
        })
    }

    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// The template with every placeholder replaced by `x`: for checking the shape of a URL.
    pub(crate) fn sample(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => s.as_str(),
                Part::Field(_) => "x",
            })
            .collect()
    }

    /// Renders the template; with `encode`, field values are percent-encoded (for URLs).
    pub(crate) fn render(
        &self,
        request: &AcceptedRequest,
        payload: &Value,
        encode: bool,
    ) -> Result<String, String> {
        let mut out = String::with_capacity(self.source.len() + 32);
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Field(f) => {
                    let value = value_of(f, request, payload)?;
                    if encode {
                        out.extend(utf8_percent_encode(&value, COMPONENT));
                    } else {
                        out.push_str(&value);
                    }
                }
            }
        }
        Ok(out)
    }
}

fn field(name: &str) -> Result<Field, String> {
    let name = name.trim();
    Ok(match name {
        "tenant" => Field::Tenant,
        "operation" => Field::Operation,
        "request_key" => Field::RequestKey,
        "task_id" => Field::TaskId,
        "target" => Field::Target,
        _ => {
            if let Some(key) = name.strip_prefix("metadata.").filter(|k| !k.is_empty()) {
                Field::Metadata(key.to_string())
            } else if let Some(path) = name.strip_prefix("payload.") {
                let parts: Vec<String> = path.split('.').map(str::to_string).collect();
                if parts.iter().any(String::is_empty) {
                    return Err(format!("`{{{name}}}` has an empty path segment"));
                }
                Field::Payload(parts)
            } else {
                return Err(format!(
                    "unknown placeholder `{{{name}}}`; use tenant, operation, request_key, task_id, target, metadata.KEY or payload.PATH"
                ));
            }
        }
    })
}

fn value_of(f: &Field, request: &AcceptedRequest, payload: &Value) -> Result<String, String> {
    let id = &request.identity;
    Ok(match f {
        Field::Tenant => id.tenant.clone(),
        Field::Operation => id.operation.clone(),
        Field::RequestKey => id.request_key.clone(),
        Field::TaskId => request.task_id().to_string(),
        Field::Target => request.target.clone(),
        Field::Metadata(key) => request
            .metadata
            .get(key)
            .cloned()
            .ok_or_else(|| format!("the request has no metadata `{key}`"))?,
        Field::Payload(path) => {
            let mut v = payload;
            for p in path {
                v = v
                    .get(p)
                    .ok_or_else(|| format!("the payload has no field `{}`", path.join(".")))?;
            }
            match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(format!(
                        "payload field `{}` is not a string, number or boolean",
                        path.join(".")
                    ))
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendledger_core::{Limits, TaskRequest};

    fn request() -> AcceptedRequest {
        TaskRequest {
            tenant: "acme".into(),
            operation: "pay".into(),
            request_key: "ord/1+2#x".into(),
            target: "payments".into(),
            payload: serde_json::json!({"customer": {"id": "c 1"}, "amount": 12, "ok": true, "list": [1]}),
            metadata: [("region".to_string(), "eu".to_string())].into(),
        }
        .accept(&Limits::default())
        .unwrap()
    }

    #[test]
    fn renders_fields_and_encodes_for_urls() {
        let r = request();
        let p = r.payload_value();
        let t = Template::parse(
            "/c/{payload.customer.id}?k={request_key}&a={payload.amount}&{{x}}&m={metadata.region}",
        )
        .unwrap();
        assert_eq!(
            t.render(&r, &p, true).unwrap(),
            "/c/c%201?k=ord%2F1%2B2%23x&a=12&{x}&m=eu"
        );
        assert_eq!(
            Template::parse("{tenant}:{request_key}")
                .unwrap()
                .render(&r, &p, false)
                .unwrap(),
            "acme:ord/1+2#x"
        );
        assert_eq!(t.sample(), "/c/x?k=x&a=x&{x}&m=x");
    }

    #[test]
    fn missing_values_and_bad_templates_are_errors() {
        let r = request();
        let p = r.payload_value();
        for (t, needle) in [
            ("{payload.nope}", "no field `nope`"),
            ("{payload.list}", "not a string"),
            ("{metadata.zone}", "no metadata `zone`"),
        ] {
            let err = Template::parse(t)
                .unwrap()
                .render(&r, &p, true)
                .unwrap_err();
            assert!(err.contains(needle), "{t}: {err}");
        }
        for (t, needle) in [
            ("{nope}", "unknown placeholder `{nope}`"),
            ("{tenant", "unclosed"),
            ("a}", "unmatched"),
            ("{payload..a}", "empty path segment"),
        ] {
            let err = Template::parse(t).unwrap_err();
            assert!(err.contains(needle), "{t}: {err}");
        }
    }
}
