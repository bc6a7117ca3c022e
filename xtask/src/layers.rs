//! The layers of `cargo xtask test`: how long each took, and those that
//! run in the background beside the VM tests.
use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

/// How long each layer of `cargo xtask test` took: printed when the run
/// ends, also when a layer failed, so a slow layer is seen in every CI log.
#[derive(Default)]
pub struct Layers(Vec<(&'static str, std::time::Duration)>);

impl Layers {
    pub fn time<T>(&mut self, layer: &'static str, run: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = std::time::Instant::now();
        let result = run();
        self.0.push((layer, started.elapsed()));
        result
    }
}

impl Drop for Layers {
    fn drop(&mut self) {
        let minutes = |d: std::time::Duration| format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60);
        let each: Vec<String> = self
            .0
            .iter()
            .map(|(layer, took)| format!("{layer} {}", minutes(*took)))
            .collect();
        let total = self.0.iter().map(|(_, took)| *took).sum();
        println!(
            "xtask: layer times: {}; total {}",
            each.join(", "),
            minutes(total)
        );
    }
}

/// A test command running in the background, its output in a log.
pub struct Beside {
    child: std::process::Child,
    log: PathBuf,
    what: &'static str,
    /// The log's lines to print when it is done.
    shown: fn(&str) -> bool,
}

impl Beside {
    pub fn start(
        cmd: &mut Command,
        log: PathBuf,
        what: &'static str,
        shown: fn(&str) -> bool,
    ) -> Result<Self> {
        let file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        cmd.stdout(file.try_clone()?).stderr(file);
        eprintln!("xtask: running {cmd:?} in the background ({})", log.display());
        let child = cmd.spawn().with_context(|| format!("cannot start {cmd:?}"))?;
        Ok(Self {
            child,
            log,
            what,
            shown,
        })
    }

    /// Waits for it and prints its result lines.
    pub fn finish(mut self) -> Result<()> {
        let status = self.child.wait()?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        for line in log.lines().filter(|l| (self.shown)(l)) {
            println!("{line}");
        }
        if !status.success() {
            bail!("{} failed ({status}); see {}", self.what, self.log.display());
        }
        Ok(())
    }
}
