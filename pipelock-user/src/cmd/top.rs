//! `pipelock top`: a live view of the traced locks.
//!
//! A collector thread owns the [`Tracer`], ticks an [`IntervalCollector`]
//! every interval and sends the snapshots over a channel; the event loop
//! here feeds them and the keys to the [`App`] and redraws with
//! [`view::draw`]. Dropping the tracer (when the collector ends) detaches
//! every program; the terminal guard restores the terminal, also on panic.

use std::{
    io::{self, IsTerminal as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use crossterm::event::{self, Event, KeyEventKind};
use ratatui::{Terminal, backend::CrosstermBackend};

use crate::{
    Error,
    bpf::{AttachMode, Filters},
    collect::{Background, Control, Flow, Tracer},
    model::{ByKey, TraceReport},
    output::{Format, Outputs},
    render,
    tui::{
        app::{Action, App, Sample},
        groups::Groupings,
        terminal::{TerminalGuard, terminal_err},
        view,
    },
};

/// What `pipelock top` watches, besides whatever the machine runs.
pub enum Load {
    None,
    /// `-- COMMAND…`, run once.
    Command(Vec<String>),
    /// `--workload NAME`: `pipelock run NAME` again each time it ends.
    Workload(String),
}

pub struct Options {
    /// None: `auto`.
    pub mode: Option<AttachMode>,
    pub interval: Duration,
    pub filters: Filters,
    /// `--track-locks`.
    pub track_locks: usize,
    /// What the table's rows are at start (`b` switches).
    pub by: ByKey,
    pub load: Load,
    pub ebpf_log: bool,
}

pub fn run(options: Options) -> Result<(), Error> {
    if !io::stdout().is_terminal() {
        return Err(Error::Usage(
            "pipelock top needs a terminal; to log reports instead, use `pipelock trace --interval SECS`"
                .to_owned(),
        ));
    }
    let mut tracer = Tracer::attach(options.mode, &options.filters, options.ebpf_log)?;
    tracer.set_track_locks(options.track_locks);
    tracer.say_asked_twice(false);
    // The header shows pipelock's own cost, so top pays for measuring it.
    tracer.enable_run_stats();
    crate::interrupt::catch();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let mut app = App::new(
        kernel,
        tracer.mode(),
        tracer.notes().to_vec(),
        options.interval.as_secs_f64(),
    )
    .with_attach(
        tracer.attached().mode.is_hooked(),
        tracer.attached().refused.clone(),
    )
    .with_grouping(
        options.by,
        Groupings {
            callers: options.filters.callers,
            tasks: options.filters.by_task,
        },
    );
    let mut load = LoadRunner::start(options.load)?;

    let (samples_tx, samples) = mpsc::channel();
    let started = Instant::now();
    let collector = Background::start(
        tracer,
        options.interval,
        move |collector, tracer| {
            let sample = Sample {
                snapshot: collector.tick(tracer)?,
                elapsed_s: started.elapsed().as_secs_f64(),
            };
            // The view is gone: nobody to show the next one to.
            Ok(if samples_tx.send(sample).is_ok() {
                Flow::Continue
            } else {
                Flow::Done
            })
        },
        |_, _| Ok(()),
    )?;

    let result = (|| -> Result<(), Error> {
        let _guard = TerminalGuard::enter()?;
        let mut terminal = Terminal::new(CrosstermBackend::new(io::stdout())).map_err(terminal_err)?;
        // Redrawn on a key, a snapshot or a resize, not on every wake-up.
        let mut dirty = true;
        loop {
            if dirty {
                terminal
                    .draw(|frame| view::draw(frame, &app))
                    .map_err(terminal_err)?;
                dirty = false;
            }
            if event::poll(Duration::from_millis(100)).map_err(terminal_err)? {
                match event::read().map_err(terminal_err)? {
                    Event::Key(key) if key.kind == KeyEventKind::Press => {
                        dirty = true;
                        match app.on_key(key) {
                            Action::Quit => return Ok(()),
                            Action::Reset => collector.send(Control::Reset),
                            Action::FlameGraph => {
                                let written = app.total.as_ref().map(|t| write_flamegraph(t, Path::new(".")));
                                app.status = Some(match written {
                                    Some(Ok(path)) => format!("wrote {}", path.display()),
                                    Some(Err(why)) => why,
                                    None => "no figures yet".to_owned(),
                                });
                            }
                            Action::None => {}
                        }
                    }
                    Event::Resize(..) => dirty = true,
                    _ => {}
                }
            }
            while let Ok(sample) = samples.try_recv() {
                app.on_sample(sample);
                dirty = true;
            }
            if crate::interrupt::flag().load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(());
            }
            if collector.is_finished() {
                // Its error is reported below, after the terminal is back.
                return Ok(());
            }
            load.poll()?;
        }
    })();
    load.stop();
    result.and(collector.finish())
}

/// The load `pipelock top` started; its output would tear the screen, so
/// it goes to /dev/null.
struct LoadRunner {
    load: Load,
    child: Option<Child>,
}

impl LoadRunner {
    fn start(load: Load) -> Result<Self, Error> {
        let mut runner = Self { load, child: None };
        runner.spawn()?;
        Ok(runner)
    }

    fn spawn(&mut self) -> Result<(), Error> {
        let mut command = match &self.load {
            Load::None => return Ok(()),
            Load::Command(argv) => {
                let mut command = Command::new(&argv[0]);
                command.args(&argv[1..]);
                command
            }
            Load::Workload(name) => {
                let exe = std::env::current_exe().map_err(|source| Error::Io {
                    what: "finding the pipelock binary",
                    source,
                })?;
                let mut command = Command::new(exe);
                command.args(["run", name, "-q", "--no-counters"]);
                command
            }
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| Error::Io {
                what: "starting the load",
                source,
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// Restarts a finished workload; a finished COMMAND stays finished.
    fn poll(&mut self) -> Result<(), Error> {
        let finished = match self.child.as_mut() {
            Some(child) => child.try_wait().ok().flatten().is_some(),
            None => false,
        };
        if finished {
            self.child = None;
            if matches!(self.load, Load::Workload(_)) {
                self.spawn()?;
            }
        }
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGINT first: a `pipelock run` leader then stops its workers.
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `F`: the waits so far by call stack as a flame graph, written whole to
/// `pipelock-top-SECONDS.svg` in `dir`; the file's path, or one line saying
/// why there is none.
fn write_flamegraph(total: &TraceReport, dir: &Path) -> Result<PathBuf, String> {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let path = dir.join(format!("pipelock-top-{seconds}.svg"));
    let svg = render::flame::flamegraph(total).map_err(|e| format!("no flame graph: {e}"))?;
    Outputs::prepare_all(&[(Some(&path), Format::FlameGraph)])
        .and_then(|outputs| outputs.write_with(|_| Ok(svg.clone())))
        .map_err(|e| format!("no flame graph: {e}"))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f_writes_the_waits_so_far_as_a_flame_graph_or_says_why_not() {
        let dir = std::env::temp_dir().join(format!("pipelock-top-flame-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut report = crate::model::fixtures::sample();
        let mut idle = report.clone();
        idle.locks.clear();
        let none = write_flamegraph(&idle, &dir);
        assert_eq!(
            none.unwrap_err(),
            "no flame graph: no waits were recorded: nothing to draw"
        );
        report.locks[0].callers = vec![crate::model::CallerRow {
            class: report.locks[0].class,
            stack: vec!["anon_pipe_write+0x50".into(), "vfs_write+0x2a4".into()],
            acquisitions: None,
            contentions: 3,
            wait_total_ns: 4300,
            wait_max_ns: 4000,
            hold_total_ns: None,
            margin: None,
        }];
        let path = write_flamegraph(&report, &dir).unwrap();
        assert!(path.starts_with(&dir) && path.extension().is_some_and(|e| e == "svg"));
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("anon_pipe_write"), "{svg}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
