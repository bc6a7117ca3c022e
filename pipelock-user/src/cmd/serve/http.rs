//! The exporter's HTTP(S) server: hyper, one connection per task, with the
//! limits an exporter reachable by anyone on the network needs.
//!
//! - A request's head must arrive whole within [`HEAD_TIMEOUT`] and fit in
//!   [`MAX_HEAD_BYTES`]; a TLS handshake must finish within the same time.
//!   A client that trickles bytes (slowloris) is dropped, and no client makes
//!   the server buffer more than that per connection.
//! - At most [`MAX_CONNECTIONS`] connections are open. When a new one comes
//!   and all are taken, the oldest connection that is not in the middle of a
//!   request is closed to make room: connections held open and silent
//!   cannot lock a scraper out. Only when every connection is mid-request is
//!   the new one closed.
//! - A connection lives at most [`MAX_LIFETIME`]; keep-alive scrapers
//!   reconnect.
//! - Credentials are checked before a request reaches the routes; bcrypt runs
//!   on one blocking thread at a time, so wrong passwords cost one CPU at
//!   most, and a scraper that knows its password is remembered.
use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    http::{Request, Response, StatusCode, header},
};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Semaphore,
    task::AbortHandle,
};
use tower::ServiceExt as _;

use super::web_config::{Users, WebConfig};

pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// hyper's read buffer, which bounds a request head (its floor is 8 KiB).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
pub const MAX_CONNECTIONS: usize = 64;
pub const MAX_LIFETIME: Duration = Duration::from_secs(300);

struct Connection {
    abort: AbortHandle,
    /// Between a request's head and its response.
    busy: Arc<AtomicBool>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Connection>,
}

impl Table {
    /// Makes room for one more: false when every connection is mid-request.
    fn make_room(&mut self) -> bool {
        if self.open.len() < MAX_CONNECTIONS {
            return true;
        }
        let idle = self
            .open
            .iter()
            .find(|(_, c)| !c.busy.load(Ordering::Relaxed))
            .map(|(&id, _)| id);
        match idle.and_then(|id| self.open.remove(&id)) {
            Some(evicted) => {
                evicted.abort.abort();
                true
            }
            None => false,
        }
    }
}

/// Takes a connection's entry out of the table when its task ends, however.
struct Leave(Arc<Mutex<Table>>, u64);

impl Drop for Leave {
    fn drop(&mut self) {
        if let Ok(mut table) = self.0.lock() {
            table.open.remove(&self.1);
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    web: WebConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let table = Arc::new(Mutex::new(Table::default()));
    let tls = web.tls.map(tokio_rustls::TlsAcceptor::from);
    let users = web.users;
    let bcrypt_slot = Arc::new(Semaphore::new(1));
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors or a connection reset before accept:
                // the listener itself is fine.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let busy = Arc::new(AtomicBool::new(false));
        let Ok(mut open) = table.lock() else { break };
        if !open.make_room() {
            drop(stream);
            continue;
        }
        let id = open.next;
        open.next += 1;
        let (app, tls, users, slot) = (app.clone(), tls.clone(), users.clone(), bcrypt_slot.clone());
        let leave = Leave(table.clone(), id);
        let busy_in_task = busy.clone();
        let task = tokio::spawn(async move {
            let _leave = leave;
            let connection = async {
                match tls {
                    Some(tls) => {
                        let Ok(Ok(stream)) = tokio::time::timeout(HEAD_TIMEOUT, tls.accept(stream)).await
                        else {
                            return;
                        };
                        connection(stream, app, users, slot, busy_in_task).await;
                    }
                    None => connection(stream, app, users, slot, busy_in_task).await,
                }
            };
            let _ = tokio::time::timeout(MAX_LIFETIME, connection).await;
        });
        open.open.insert(
            id,
            Connection {
                abort: task.abort_handle(),
                busy,
            },
        );
    }
    // Scrapes are idempotent: whatever is in flight is dropped.
    if let Ok(table) = table.lock() {
        for connection in table.open.values() {
            connection.abort.abort();
        }
    }
    Ok(())
}

async fn connection<S>(
    stream: S,
    app: Router,
    users: Option<Arc<Users>>,
    slot: Arc<Semaphore>,
    busy: Arc<AtomicBool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (app, users, slot, busy) = (app.clone(), users.clone(), slot.clone(), busy.clone());
        async move {
            busy.store(true, Ordering::Relaxed);
            let response = match authorized(users, slot, &request).await {
                true => app.oneshot(request.map(Body::new)).await,
                false => Ok(unauthorized()),
            };
            busy.store(false, Ordering::Relaxed);
            response
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn authorized(users: Option<Arc<Users>>, slot: Arc<Semaphore>, request: &Request<Incoming>) -> bool {
    let Some(users) = users else { return true };
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // A scraper that passed before does not queue behind wrong passwords.
    if users.remembered(header.as_deref()) {
        return true;
    }
    let Ok(_permit) = slot.acquire_owned().await else {
        return false;
    };
    tokio::task::spawn_blocking(move || users.allows(header.as_deref()))
        .await
        .unwrap_or(false)
}

fn unauthorized() -> Response<Body> {
    let mut response = Response::new(Body::from("Unauthorized\n"));
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Basic realm=\"pipelock\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_closes_its_oldest_idle_connection_and_never_a_busy_one() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut table = Table::default();
            let mut tasks = Vec::new();
            for id in 0..MAX_CONNECTIONS as u64 {
                let task = tokio::spawn(std::future::pending::<()>());
                table.open.insert(
                    id,
                    Connection {
                        abort: task.abort_handle(),
                        // The three oldest are mid-request.
                        busy: Arc::new(AtomicBool::new(id < 3)),
                    },
                );
                tasks.push(task);
            }
            assert!(table.make_room());
            assert_eq!(table.open.len(), MAX_CONNECTIONS - 1);
            assert!(!table.open.contains_key(&3), "the oldest idle one is closed");
            assert!((0..3).all(|id| table.open.contains_key(&id)), "busy ones stay");
            tokio::task::yield_now().await;
            assert!(tasks[3].is_finished() && !tasks[4].is_finished());

            assert!(table.make_room(), "below the cap there is room");
            let task = tokio::spawn(std::future::pending::<()>());
            table.open.insert(
                1000,
                Connection {
                    abort: task.abort_handle(),
                    busy: Arc::new(AtomicBool::new(true)),
                },
            );
            for connection in table.open.values() {
                connection.busy.store(true, Ordering::Relaxed);
            }
            assert!(!table.make_room(), "every connection mid-request: no room");
            assert_eq!(table.open.len(), MAX_CONNECTIONS);
        });
    }
}
