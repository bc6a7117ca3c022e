//! `pipelock ab --source`: the two kernels built (or found in the cache)
//! before anything boots, with the build's progress on the terminal.
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pipelock_vm::build::{self, Change, Event, Request};

use super::guest::Kernel;
use crate::{Error, cli::AbArgs, model::PatchedFunction};

/// The kernels `ab` compares, as asked for.
pub enum Kernels {
    /// Two `--kernel`s: images, packages or package names.
    Given(Vec<String>),
    /// Built from a source tree.
    Built(Request),
}

/// What the arguments ask to compare; one line of usage if it is not clear.
pub fn kernels_asked(args: &AbArgs) -> Result<Kernels, Error> {
    let Some(source) = &args.source else {
        if args.patch.is_some()
            || !args.revs.is_empty()
            || args.config.is_some()
            || args.build_cache.is_some()
        {
            return Err(Error::Usage(
                "--patch, --rev, --config and --build-cache go with --source DIR".to_owned(),
            ));
        }
        if args.kernels.len() != 2 {
            return Err(Error::Usage(
                "--kernel: give exactly two kernels, A and B".to_owned(),
            ));
        }
        return Ok(Kernels::Given(args.kernels.clone()));
    };
    let change = match (&args.patch, &args.revs[..]) {
        (Some(patch), []) => Change::Patch(patch.clone()),
        (None, [a, b]) => Change::Revs {
            a: a.clone(),
            b: b.clone(),
        },
        (None, []) => {
            return Err(Error::Usage(
                "--source: say what B is: --patch FILE, or --rev A --rev B".to_owned(),
            ));
        }
        _ => return Err(Error::Usage("--rev: give two, A then B".to_owned())),
    };
    let jobs = args.jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |j| j as usize,
    );
    Ok(Kernels::Built(Request {
        source: source.clone(),
        change,
        config: args.config.clone(),
        cache: args
            .build_cache
            .clone()
            .unwrap_or_else(|| super::guest::cache_dir().join("builds")),
        jobs,
    }))
}

fn took(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Builds A and B, showing what make is doing; prints each build's time.
pub fn build_both(request: &Request) -> Result<[Kernel; 2], Error> {
    crate::interrupt::catch();
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix}: {pos} steps, {elapsed} · {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut on = |event: Event<'_>| match event {
        Event::Step(step) => {
            if bar.is_hidden() {
                eprintln!("pipelock ab: {step}");
            } else {
                bar.println(format!("pipelock ab: {step}"));
            }
            bar.set_prefix(step.to_owned());
            bar.set_position(0);
            bar.reset_elapsed();
        }
        Event::Line(line) => {
            // kbuild's quiet lines: `  CC      fs/pipe.o`.
            if line.starts_with("  ") && !line.trim().is_empty() {
                bar.inc(1);
                bar.set_message(line.split_whitespace().collect::<Vec<_>>().join(" "));
            }
        }
    };
    let built = build::build(request, &mut on, &crate::interrupt::interrupted);
    bar.finish_and_clear();
    let kernels = match built {
        Ok(kernels) => kernels,
        Err(pipelock_vm::Error::Interrupted) => {
            eprintln!("pipelock ab: interrupted during a kernel build; the cache keeps nothing of it");
            return Err(Error::Interrupted);
        }
        Err(source) => return Err(Error::Vm { source }),
    };
    for (side, kernel) in ["A", "B"].iter().zip(&kernels) {
        match (kernel.built_in, &kernel.log) {
            (Some(t), Some(log)) => eprintln!(
                "pipelock ab: {side} ({}) built in {}: {} (log: {})",
                kernel.label,
                took(t),
                kernel.image.display(),
                log.display()
            ),
            _ => eprintln!(
                "pipelock ab: {side} ({}) from the cache: {}",
                kernel.label,
                kernel.image.display()
            ),
        }
    }
    // Booted as any `--kernel` bzImage a user built themselves.
    let [a, b] = kernels;
    let resolve = |k: build::Kernel| -> Result<Kernel, Error> {
        let image = super::guest::resolve(&k.image.to_string_lossy())?;
        Ok(Kernel {
            spec: k.label,
            image: image.image,
        })
    };
    Ok([resolve(a)?, resolve(b)?])
}

/// The functions B's change makes to A's tree; none (and a line saying
/// why) where the change cannot be read against the tree.
pub fn patched(request: &Request) -> Vec<PatchedFunction> {
    match build::touched::of_request(request) {
        Ok(touched) => touched
            .into_iter()
            .map(|t| PatchedFunction {
                file: t.file,
                function: t.function,
                inline: t.inline,
                is_static: t.is_static,
                callers: t.callers,
                added: t.added,
            })
            .collect(),
        Err(why) => {
            eprintln!("pipelock ab: which functions B changes is not known: {why}");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn asked(line: &str) -> Result<Kernels, String> {
        let cli = Cli::try_parse_from(line.split_whitespace()).map_err(|e| e.to_string())?;
        let Command::Ab(args) = cli.command else {
            return Err("not ab".to_owned());
        };
        kernels_asked(&args).map_err(|e| e.to_string())
    }

    #[test]
    fn a_source_tree_comes_with_a_patch_or_two_revs() {
        let Ok(Kernels::Built(request)) =
            asked("pipelock ab --source /s --patch p.diff --jobs 3 -- run pipe-herd")
        else {
            panic!("a patch");
        };
        assert!(matches!(request.change, Change::Patch(ref p) if p.as_os_str() == "p.diff"));
        assert_eq!(request.jobs, 3);
        assert!(matches!(
            asked("pipelock ab --source /s --rev v6.1 --rev HEAD -- run pipe-herd"),
            Ok(Kernels::Built(Request {
                change: Change::Revs { .. },
                ..
            }))
        ));
        let err = |line| asked(line).err().unwrap_or_default();
        assert!(err("pipelock ab --source /s -- run pipe-herd").contains("--patch FILE"));
        assert!(err("pipelock ab --source /s --rev a -- run pipe-herd").contains("give two"));
        assert!(!err("pipelock ab --source /s --kernel k -- run pipe-herd").is_empty());
        assert!(!err("pipelock ab --kernel a --kernel b --patch p -- run pipe-herd").is_empty());
        assert!(err("pipelock ab --kernel a -- run pipe-herd").contains("exactly two"));
        assert!(matches!(
            asked("pipelock ab --kernel a --kernel b -- run pipe-herd"),
            Ok(Kernels::Given(k)) if k.len() == 2
        ));
    }
}
