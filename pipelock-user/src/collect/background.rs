//! The collector on a thread of its own, for commands whose foreground is
//! busy with something else (a screen, an HTTP server, a workload): it
//! drains the maps every period, so every command that traces keeps the
//! kernel maps to one interval's locks, and hands each drain to the command.
use std::{
    sync::mpsc::{self, RecvTimeoutError},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use super::{IntervalCollector, Tracer};
use crate::{Error, model::TraceReport};

/// What the foreground asks of the collector.
#[derive(Debug)]
pub enum Control {
    /// Start the running totals afresh.
    Reset,
    /// Drain now and answer with the report of the part that ends
    /// (`IntervalCollector::end_part`): the foreground waits for it, so
    /// nothing of the next part is in it.
    EndPart(mpsc::SyncSender<Result<TraceReport, Error>>),
    /// Finish: the last step runs, then the tracer is dropped (detached).
    Stop,
}

/// The collector thread; `finish` stops it and returns what its last step
/// made.
pub struct Background<T> {
    control: mpsc::Sender<Control>,
    thread: JoinHandle<Result<T, Error>>,
}

/// Whether the collector goes on after a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Nobody listens any more (the view is gone): end without a last step.
    Done,
}

impl<T: Send + 'static> Background<T> {
    /// Moves `tracer` to a thread that calls `each_tick` every `period` and
    /// `at_stop` once when stopped (each gets the collector and the tracer:
    /// what to drain and report is theirs to say).
    pub fn start(
        tracer: Tracer,
        period: Duration,
        each_tick: impl FnMut(&mut IntervalCollector, &mut Tracer) -> Result<Flow, Error> + Send + 'static,
        at_stop: impl FnOnce(&mut IntervalCollector, &mut Tracer) -> Result<T, Error> + Send + 'static,
    ) -> Result<Self, Error>
    where
        T: Default,
    {
        Self::spawn(tracer, period, false, each_tick, at_stop)
    }

    /// As `start`, with the collector keeping parts for `end_part`: from
    /// attach to the first `end_part`, and from each to the next.
    pub fn start_in_parts(
        tracer: Tracer,
        period: Duration,
        each_tick: impl FnMut(&mut IntervalCollector, &mut Tracer) -> Result<Flow, Error> + Send + 'static,
        at_stop: impl FnOnce(&mut IntervalCollector, &mut Tracer) -> Result<T, Error> + Send + 'static,
    ) -> Result<Self, Error>
    where
        T: Default,
    {
        Self::spawn(tracer, period, true, each_tick, at_stop)
    }

    fn spawn(
        tracer: Tracer,
        period: Duration,
        in_parts: bool,
        mut each_tick: impl FnMut(&mut IntervalCollector, &mut Tracer) -> Result<Flow, Error> + Send + 'static,
        at_stop: impl FnOnce(&mut IntervalCollector, &mut Tracer) -> Result<T, Error> + Send + 'static,
    ) -> Result<Self, Error>
    where
        T: Default,
    {
        let (control, commands) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("collector".into())
            .spawn(move || -> Result<T, Error> {
                let mut tracer = tracer;
                let mut collector = IntervalCollector::new(&tracer);
                if in_parts {
                    collector.track_parts();
                }
                let mut next = Instant::now() + period;
                loop {
                    match commands.recv_timeout(next.saturating_duration_since(Instant::now())) {
                        Ok(Control::Reset) => collector.reset(),
                        Ok(Control::EndPart(answer)) => {
                            let _ = answer.send(collector.end_part(&mut tracer));
                        }
                        Ok(Control::Stop) | Err(RecvTimeoutError::Disconnected) => {
                            return at_stop(&mut collector, &mut tracer);
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            next += period;
                            if each_tick(&mut collector, &mut tracer)? == Flow::Done {
                                return Ok(T::default());
                            }
                        }
                    }
                }
            })
            .map_err(|source| Error::Io {
                what: "starting the collector thread",
                source,
            })?;
        Ok(Self { control, thread })
    }

    /// Asks the collector for something; a collector that has ended
    /// already answers nothing (its result comes from `finish`).
    pub fn send(&self, what: Control) {
        let _ = self.control.send(what);
    }

    /// Ends the current part and returns its report; the collector must
    /// have been started with `track_parts`.
    pub fn end_part(&self) -> Result<TraceReport, Error> {
        let (answer, report) = mpsc::sync_channel(1);
        self.send(Control::EndPart(answer));
        report.recv().unwrap_or(Err(Error::CollectorPanicked))
    }

    /// Whether the thread has ended (an error, or nobody listening).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops the collector and waits for its last step.
    pub fn finish(self) -> Result<T, Error> {
        self.send(Control::Stop);
        self.thread.join().unwrap_or(Err(Error::CollectorPanicked))
    }
}
