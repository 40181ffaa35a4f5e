//! Files written whole or not at all.

use std::path::Path;

/// Replaces `path` with `contents` through a sibling `.tmp` file and a rename, so a process
/// stopped while writing leaves the old file, never a part of the new one.
pub fn replace(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}
