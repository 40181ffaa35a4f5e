//! TOML files over typed defaults: every key is optional, unknown keys and wrong types are
//! one-line errors that name the key.

use std::path::Path;

use burn::config::Config;
use toml::{Table, Value};

use crate::config::ConfigError;
use crate::model::NsaLmConfig;

/// `defaults` with the keys of `table` laid over it. `prefix` (e.g. `model.`) names the table in
/// errors.
pub fn merge_over<C: Config>(defaults: &C, table: &Table, prefix: &str) -> Result<C, ConfigError> {
    let Value::Table(mut merged) = Value::try_from(defaults).map_err(|e| ConfigError::new(prefix, one_line(e)))? else {
        return Err(ConfigError::new(prefix, "defaults are not a table"));
    };
    merge_table(&mut merged, table, prefix)?;
    serde_path_to_error::deserialize(Value::Table(merged))
        .map_err(|e| ConfigError::new(format!("{prefix}{}", e.path()), one_line(e.into_inner())))
}

fn merge_table(base: &mut Table, overlay: &Table, prefix: &str) -> Result<(), ConfigError> {
    for (key, value) in overlay {
        let field = format!("{prefix}{key}");
        let Some(slot) = base.get_mut(key) else {
            return Err(ConfigError::new(field, "unknown key"));
        };
        match (slot, value) {
            (Value::Table(inner), Value::Table(over)) => merge_table(inner, over, &format!("{field}."))?,
            (slot @ Value::Float(_), Value::Integer(i)) => *slot = Value::Float(*i as f64),
            (slot, value) if slot.same_type(value) => *slot = value.clone(),
            (slot, value) => {
                return Err(ConfigError::new(
                    field,
                    format!("expected {}, found {}", slot.type_str(), value.type_str()),
                ))
            }
        }
    }
    Ok(())
}

fn one_line(e: impl std::fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Reads and parses a TOML file into its top-level table.
pub fn read_table(path: &Path) -> Result<Table, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::new(&name, format!("cannot read: {e}")))?;
    text.parse::<Table>().map_err(|e| {
        let place = e.span().map(|span| line_and_column(&text, span.start)).unwrap_or_default();
        ConfigError::new(&name, format!("{place}not valid TOML: {}", one_line(e.message())))
    })
}

/// `line L, column C: ` of a byte offset in `text`, both counted from 1 (columns in characters).
fn line_and_column(text: &str, offset: usize) -> String {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
    format!("line {line}, column {column}: ")
}

impl NsaLmConfig {
    /// The model of a TOML document's `[model]` table (production-shape defaults for missing
    /// keys), validated. `sections` lists the other top-level tables the caller accepts.
    pub fn from_table(table: &Table, sections: &[&str]) -> Result<Self, ConfigError> {
        if let Some(key) = table.keys().find(|k| *k != "model" && !sections.contains(&k.as_str())) {
            return Err(ConfigError::new(key.as_str(), "unknown section"));
        }
        let model = match table.get("model") {
            None => Table::new(),
            Some(Value::Table(model)) => model.clone(),
            Some(other) => {
                return Err(ConfigError::new("model", format!("expected a table, found {}", other.type_str())))
            }
        };
        let config = merge_over(&NsaLmConfig::new(), &model, "model.")?;
        config.validate().map_err(|e| e.under("model."))?;
        Ok(config)
    }

    /// Loads a model config file that holds only `[model]`.
    pub fn load_toml(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::from_table(&read_table(path.as_ref())?, &[])
    }
}
