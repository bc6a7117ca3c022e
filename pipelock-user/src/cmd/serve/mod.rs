//! `pipelock serve`: a Prometheus/OpenMetrics exporter.
//!
//! A collector thread owns the [`Tracer`] (its map reads are blocking
//! syscalls) and ticks an [`IntervalCollector`]; each tick's running total
//! is published through a `watch` channel. On tokio, hyper (with the limits
//! of [`http`]) and axum's routes answer `/metrics` from the latest
//! published total, encoded once per collection however often it is
//! scraped, so a scrape never waits for collection and collection never
//! waits for a scrape, and `/healthz` says whether collection is alive.
//! Once the programs are attached the process drops its capabilities.
//! SIGTERM/SIGINT stop the server, the collector detaches the programs and
//! the process exits 0; a second signal exits at once.
mod http;
mod web_config;

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use web_config::WebConfig;

use crate::{
    Error,
    bpf::{AttachMode, Filters},
    collect::{Background, Flow, Tracer},
    kernel::privilege,
    render::metrics::{Addresses, Exposition, openmetrics, prometheus_text},
};

pub struct Options {
    pub listen: String,
    pub mode: Option<AttachMode>,
    pub filters: Filters,
    /// `--track-locks`.
    pub track_locks: usize,
    pub per_lock_top: usize,
    pub addresses: Addresses,
    pub interval: Duration,
    pub ebpf_log: bool,
    /// `--web-config`: TLS and basic auth (the exporter-toolkit's format).
    pub web_config: Option<PathBuf>,
}

/// One collection's totals, encoded on the first scrape that asks.
struct Rendered {
    exposition: Arc<Exposition>,
    openmetrics: OnceLock<Bytes>,
    prometheus: OnceLock<Bytes>,
}

impl Rendered {
    fn openmetrics(&self) -> &Bytes {
        self.openmetrics
            .get_or_init(|| Bytes::from(openmetrics(self.exposition.clone())))
    }

    fn prometheus(&self) -> &Bytes {
        self.prometheus.get_or_init(|| {
            Bytes::from(prometheus_text(
                std::str::from_utf8(self.openmetrics()).unwrap_or(""),
            ))
        })
    }
}

/// What the collector last published, and when.
#[derive(Clone)]
struct Published {
    exposition: Option<Arc<Rendered>>,
    at: Instant,
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `--listen`, parsed and bound before anything is attached.
fn bind(listen: &str) -> Result<TcpListener, Error> {
    let addr: SocketAddr = listen.parse().map_err(|_| {
        Error::Usage(format!(
            "--listen {listen}: not an address (HOST:PORT, e.g. 127.0.0.1:9435 or [::1]:9435)"
        ))
    })?;
    let listener = TcpListener::bind(addr).map_err(|err| match err.kind() {
        std::io::ErrorKind::AddrInUse => Error::Usage(format!("--listen {listen}: the address is in use")),
        _ => Error::Usage(format!("--listen {listen}: cannot listen there ({err})")),
    })?;
    listener.set_nonblocking(true).map_err(|source| Error::Io {
        what: "fcntl(O_NONBLOCK)",
        source,
    })?;
    Ok(listener)
}

pub fn run(options: Options) -> Result<(), Error> {
    if options.interval.is_zero() {
        return Err(Error::Usage("--interval must be greater than 0".to_owned()));
    }
    let web = options.web_config.as_deref().map(WebConfig::load).transpose()?;
    let scheme = if web.as_ref().is_some_and(|w| w.tls.is_some()) {
        "https"
    } else {
        "http"
    };
    let listener = bind(&options.listen)?;
    let mut tracer = Tracer::attach(options.mode, &options.filters, options.ebpf_log)?;
    tracer.set_track_locks(options.track_locks);
    // The tracer's own cost is one of the exported metrics.
    tracer.enable_run_stats();
    // Everything that needs a privilege is done: the maps are read through
    // descriptors already open. kprobe mode keeps them, to remove its
    // return probes from tracefs when it stops.
    if tracer.attached().mode != AttachMode::Kprobe {
        privilege::drop_all()?;
    }
    let classes = options.filters.classes();
    let (published, subscribed) = watch::channel(Published {
        exposition: None,
        at: Instant::now(),
    });
    let (interval, per_lock_top, addresses) = (options.interval, options.per_lock_top, options.addresses);
    let collector = Background::start(
        tracer,
        interval,
        move |collector, tracer| {
            let drained = collector.drain(tracer)?;
            let exposition = Exposition {
                report: collector.total_report(tracer, &drained.fill)?,
                classes,
                per_lock_top,
                addresses: addresses.clone(),
                version: env!("CARGO_PKG_VERSION"),
            };
            published.send_replace(Published {
                exposition: Some(Arc::new(Rendered {
                    exposition: Arc::new(exposition),
                    openmetrics: OnceLock::new(),
                    prometheus: OnceLock::new(),
                })),
                at: Instant::now(),
            });
            Ok(Flow::Continue)
        },
        |_, _| Ok(()),
    )?;
    eprintln!(
        "pipelock: serving metrics on {scheme}://{}/metrics{} (Ctrl-C or SIGTERM to stop)",
        options.listen,
        if web.as_ref().is_some_and(|w| w.users.is_some()) {
            ", basic auth"
        } else {
            ""
        }
    );
    let served = serve(listener, subscribed, interval, web.unwrap_or(WebConfig::none()));
    // Stopping the collector drops the tracer: everything is detached.
    served.and(collector.finish())
}

/// Runs the HTTP server until the first SIGTERM or SIGINT.
fn serve(
    listener: TcpListener,
    subscribed: watch::Receiver<Published>,
    interval: Duration,
    web: WebConfig,
) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            what: "tokio runtime",
            source,
        })?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| Error::Io {
            what: "listen",
            source,
        })?;
        let mut terminate = signal(SignalKind::terminate()).map_err(|source| Error::Io {
            what: "sigaction",
            source,
        })?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(|source| Error::Io {
            what: "sigaction",
            source,
        })?;
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .with_state((subscribed, interval));
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            // A second signal while shutting down: out at once.
            tokio::spawn(async move {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = interrupt.recv() => {}
                }
                std::process::exit(130);
            });
        };
        http::serve(listener, app, web, shutdown)
            .await
            .map_err(|source| Error::Io {
                what: "serve",
                source,
            })
    })
}

type AppState = (watch::Receiver<Published>, Duration);

/// OpenMetrics when the scraper asks for it (Prometheus does), the
/// Prometheus text format otherwise.
async fn metrics(State((subscribed, _)): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    let Some(exposition) = subscribed.borrow().exposition.clone() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            Bytes::from_static(b"the first collection has not finished yet\n"),
        );
    };
    let wants_openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/openmetrics-text"));
    if wants_openmetrics {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, OPENMETRICS)],
            exposition.openmetrics().clone(),
        )
    } else {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            exposition.prometheus().clone(),
        )
    }
}

/// 200 while collection runs (a tick within three intervals), else 503.
async fn healthz(State((subscribed, interval)): State<AppState>) -> impl IntoResponse {
    let last = subscribed.borrow().clone();
    let age = last.at.elapsed();
    if last.exposition.is_some() && age <= interval * 3 {
        (StatusCode::OK, "ok\n".to_owned())
    } else if last.exposition.is_none() && age <= interval * 3 {
        (StatusCode::OK, "starting\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stale: the last collection finished {:.1} s ago\n",
                age.as_secs_f64()
            ),
        )
    }
}
