//! Result files (`--json`, `--csv`, `--folded`, `--flamegraph`): checked writable before any work, then
//! replaced atomically, so a failed or killed command never leaves a
//! half-written file.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
};

use crate::Error;

/// Result files, checked writable before any run and replaced atomically
/// after: a killed run never leaves a half-written file.
pub struct Outputs {
    files: Vec<(PathBuf, PathBuf, Format)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
    /// Folded stacks (FlameGraph's input).
    Folded,
    /// A flame graph SVG.
    FlameGraph,
    /// A self-contained HTML page.
    Html,
}

impl Outputs {
    pub fn prepare(json: Option<&Path>, csv: Option<&Path>) -> Result<Self, Error> {
        Self::prepare_all(&[(json, Format::Json), (csv, Format::Csv)])
    }

    /// Each file given (None: not asked for) in its format.
    pub fn prepare_all(asked: &[(Option<&Path>, Format)]) -> Result<Self, Error> {
        let mut files = Vec::new();
        for &(path, format) in asked {
            let Some(path) = path else { continue };
            if path.is_dir() {
                return Err(Error::Output {
                    path: path.to_owned(),
                    source: std::io::Error::new(std::io::ErrorKind::IsADirectory, "a directory, not a file"),
                });
            }
            let mut staging = path.as_os_str().to_owned();
            staging.push(format!(".partial-{}", std::process::id()));
            let staging = PathBuf::from(staging);
            fs::File::create(&staging).map_err(|source| Error::Output {
                path: path.to_owned(),
                source,
            })?;
            files.push((path.to_owned(), staging, format));
        }
        Ok(Self { files })
    }

    /// Writes each file with the bytes `render` makes for its format.
    pub fn write_with(mut self, render: impl Fn(Format) -> std::io::Result<Vec<u8>>) -> Result<(), Error> {
        for (path, staging, format) in std::mem::take(&mut self.files) {
            let bytes = render(format);
            let result = bytes.and_then(|bytes| {
                let mut file = fs::File::create(&staging)?;
                file.write_all(&bytes)?;
                file.sync_all()?;
                fs::rename(&staging, &path)
            });
            if let Err(source) = result {
                let _ = fs::remove_file(&staging);
                return Err(Error::Output { path, source });
            }
        }
        Ok(())
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        // Reached on errors before `write`: leave no staging files behind.
        for (_, staging, _) in &self.files {
            let _ = fs::remove_file(staging);
        }
    }
}
