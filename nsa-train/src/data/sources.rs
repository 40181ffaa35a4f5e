//! Reading documents from `.txt`, `.jsonl` (a `text` field) and `.parquet` (a `text` column, the
//! FineWeb-Edu layout). Every failure is a one-line [`DataError`] naming the file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;

/// A data problem, displayed as one line that names the file (and line or row when known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataError(pub String);

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DataError {}

fn fail(path: &Path, what: impl std::fmt::Display) -> DataError {
    let what = what.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
    DataError(format!("{}: {what}", path.display()))
}

/// The documents read from a set of paths, and the files their directories held that are not
/// data (named in messages, never skipped silently).
#[derive(Debug, Default)]
pub struct Documents {
    pub docs: Vec<String>,
    pub skipped: Vec<PathBuf>,
}

impl Documents {
    /// "skipped N files that are not ...: a, b, c" (the first few named), or `None`.
    pub fn skipped_note(&self) -> Option<String> {
        const SHOWN: usize = 5;
        if self.skipped.is_empty() {
            return None;
        }
        let names: Vec<String> = self.skipped.iter().take(SHOWN).map(|p| p.display().to_string()).collect();
        let more = self.skipped.len().saturating_sub(SHOWN);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        Some(format!(
            "skipped {} file(s) that are not .txt, .md, .jsonl or .parquet: {}{more}",
            self.skipped.len(),
            names.join(", ")
        ))
    }
}

/// All documents of the given files and directories (directories are read recursively, in
/// sorted order, keeping `.txt`, `.md`, `.jsonl` and `.parquet` files and noting the others).
pub fn read_documents(paths: &[PathBuf]) -> Result<Documents, DataError> {
    let mut found = Documents::default();
    for file in expand(paths, &mut found.skipped)? {
        found.docs.extend(read_file(&file)?);
    }
    Ok(found)
}

fn expand(paths: &[PathBuf], skipped: &mut Vec<PathBuf>) -> Result<Vec<PathBuf>, DataError> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| fail(path, format!("cannot open: {e}")))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| fail(path, format!("cannot list: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            let (data, other): (Vec<PathBuf>, Vec<PathBuf>) =
                entries.into_iter().partition(|p| p.is_dir() || kind(p).is_some());
            skipped.extend(other);
            files.extend(expand(&data, skipped)?);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Txt,
    Jsonl,
    Parquet,
}

fn kind(path: &Path) -> Option<Kind> {
    match path.extension()?.to_str()? {
        "txt" | "md" => Some(Kind::Txt),
        "jsonl" => Some(Kind::Jsonl),
        "parquet" => Some(Kind::Parquet),
        _ => None,
    }
}

/// The documents of one file. A `.txt` file is split into documents at blank-line runs of three
/// or more newlines, so a book with chapters still packs as one stream per chapter group.
pub fn read_file(path: &Path) -> Result<Vec<String>, DataError> {
    let docs = match kind(path) {
        Some(Kind::Txt) => read_txt(path)?,
        Some(Kind::Jsonl) => read_jsonl(path)?,
        Some(Kind::Parquet) => read_parquet(path)?,
        None => return Err(fail(path, "unsupported file type (expected .txt, .md, .jsonl or .parquet)")),
    };
    Ok(docs.into_iter().filter(|d| !d.trim().is_empty()).collect())
}

fn read_txt(path: &Path) -> Result<Vec<String>, DataError> {
    let bytes = std::fs::read(path).map_err(|e| fail(path, format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| fail(path, format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to())))?;
    Ok(text.split("\n\n\n").map(str::to_owned).collect())
}

fn read_jsonl(path: &Path) -> Result<Vec<String>, DataError> {
    let file = File::open(path).map_err(|e| fail(path, format!("cannot open: {e}")))?;
    let mut docs = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| fail(path, format!("line {}: cannot read: {e}", i + 1)))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| fail(path, format!("line {}: invalid JSON: {e}", i + 1)))?;
        match value.get("text") {
            Some(serde_json::Value::String(text)) => docs.push(text.clone()),
            Some(_) => return Err(fail(path, format!("line {}: field `text` is not a string", i + 1))),
            None => return Err(fail(path, format!("line {}: no `text` field", i + 1))),
        }
    }
    Ok(docs)
}

/// The `text` column's strings, row by row (null rows skipped), through parquet's row reader:
/// Arrow's columnar reader would add a dozen crates to every first build for one string column.
fn read_parquet(path: &Path) -> Result<Vec<String>, DataError> {
    let file = File::open(path).map_err(|e| fail(path, format!("cannot open: {e}")))?;
    let reader =
        SerializedFileReader::new(file).map_err(|e| fail(path, format!("not a readable parquet file: {e}")))?;
    let root = reader.metadata().file_metadata().schema_descr().root_schema();
    let text = root.get_fields().iter().find(|f| f.name() == "text").ok_or_else(|| fail(path, "no `text` column"))?;
    let projection =
        Type::group_type_builder(root.name()).with_fields(vec![text.clone()]).build().map_err(|e| fail(path, e))?;
    let rows = reader.get_row_iter(Some(projection)).map_err(|e| fail(path, e))?;
    let mut docs = Vec::new();
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| fail(path, format!("row {}: cannot decode: {e}", i + 1)))?;
        match row.get_column_iter().next().map(|(_, field)| field) {
            Some(Field::Str(text)) => docs.push(text.clone()),
            Some(Field::Null) | None => {}
            Some(other) => {
                return Err(fail(path, format!("row {}: column `text` holds {other}, expected a string", i + 1)))
            }
        }
    }
    Ok(docs)
}
