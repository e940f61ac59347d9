//! Environment overrides of the configuration file: `SENDLEDGER__<SECTION>__<FIELD>=value`
//! sets `<section>.<field>` (names lower-cased, `__` between levels; under `kafka.properties` a
//! `_` or `__` becomes a `.`). A value is read as a TOML literal when it is one, else as a
//! string, and as the string after all when the field wants one. An error in a field an
//! override set names the variable; the value of a secret field is never shown.

use std::collections::BTreeMap;

use sendledger_kafka::config::is_secret;

use super::Config;
use crate::error::ConfigError;

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "SENDLEDGER__";

/// `doc` with the overrides `env` holds applied, deserialized into a [`Config`] (not yet
/// validated).
pub(super) fn deserialize_with_overrides(
    mut doc: toml::Table,
    env: &BTreeMap<String, String>,
) -> Result<Config, ConfigError> {
    // (path, variable, raw value, whether it was read as a non-string literal)
    let mut overrides = Vec::new();
    for (name, value) in env {
        let Some(path) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let in_variable = |e: ConfigError| ConfigError::Environment {
            name: name.clone(),
            source: Box::new(e),
        };
        let path = override_path(path).map_err(in_variable)?;
        let value_literal = literal(value);
        let typed = !value_literal.is_str();
        set(&mut doc, &path, value_literal).map_err(in_variable)?;
        overrides.push((path, name.clone(), value.clone(), typed));
    }
    loop {
        match serde_path_to_error::deserialize(toml::Value::Table(doc.clone())) {
            Ok(config) => return Ok(config),
            Err(e) => {
                let field = e.path().to_string();
                let by = overrides.iter_mut().find(|(p, ..)| p.join(".") == field);
                match by {
                    // `12345` was read as a number where a string is expected: the text.
                    Some((path, _, raw, typed)) if *typed => {
                        *typed = false;
                        set(&mut doc, path, toml::Value::String(raw.clone()))?;
                    }
                    Some((_, var, ..)) => {
                        return Err(ConfigError::FieldSetBy {
                            problem: problem(&field, e),
                            field,
                            variable: var.clone(),
                        })
                    }
                    None => {
                        return Err(ConfigError::Field {
                            problem: problem(&field, e),
                            field,
                        })
                    }
                }
            }
        }
    }
}

/// Why the value at `field` does not fit; serde's text may quote the value, so not for a
/// secret.
fn problem(field: &str, e: serde_path_to_error::Error<toml::de::Error>) -> String {
    if is_secret(field) {
        "is not valid here (the value is not shown: it is secret)".into()
    } else {
        e.into_inner().to_string()
    }
}

/// `KAFKA__PROPERTIES__SASL_PASSWORD` → `["kafka", "properties", "sasl.password"]`; so does
/// `KAFKA__PROPERTIES__SASL__PASSWORD` (a property's value is never a table).
fn override_path(path: &str) -> Result<Vec<String>, ConfigError> {
    let parts: Vec<&str> = path.split("__").collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::OverridePath(
            "has an empty name between `__` separators".into(),
        ));
    }
    let mut out: Vec<String> = parts.iter().map(|p| p.to_ascii_lowercase()).collect();
    if out.len() >= 3 && out[0] == "kafka" && out[1] == "properties" {
        let property = out[2..].join(".").replace('_', ".");
        out.truncate(2);
        out.push(property);
    }
    Ok(out)
}

/// A TOML literal when `value` is one, else the string itself.
fn literal(value: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()))
}

fn set(doc: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), ConfigError> {
    let (last, parents) = path.split_last().expect("override paths are not empty");
    let mut table = doc;
    for (i, key) in parents.iter().enumerate() {
        let entry = table
            .entry(key.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(ConfigError::OverridePath(format!(
                    "`{}` is not a section",
                    parents[..=i].join(".")
                )))
            }
        };
    }
    table.insert(last.clone(), value);
    Ok(())
}
