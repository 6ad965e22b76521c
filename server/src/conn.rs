//! Connections: the accept loop over hyper's HTTP/1 server, with the limits
//! a server open to the network needs, all applied per connection before a
//! request reaches routing or authentication:
//!
//! - a header-read timeout (`--header-timeout`): a client has that long to
//!   send a complete request line and headers, counted from when the server
//!   starts waiting for them (the connection opens, or its previous response
//!   ends). hyper enforces it and drops the connection.
//! - an idle timeout (`--idle-timeout`): a connection with no request in
//!   flight and no byte of a new one is closed after it.
//! - llama-server's read/write timeout (`-to/--timeout`): a request body
//!   that delivers nothing, or a response write the client does not take,
//!   for that long ends the connection.
//! - a connection cap (`--max-connections`). At the cap a new connection is
//!   still accepted, and the open connection that has waited longest with no
//!   request in flight (idle, or still sending its headers) is closed to make
//!   room: slow or idle sockets cannot lock out a client that sends a whole
//!   request, such as a `/health` probe. When every connection has a request
//!   in flight, the new one is closed at once. The same eviction runs when
//!   the process is out of file descriptors.
//!
//! Graceful shutdown: once `shutdown` resolves the listener closes, every
//! connection finishes its in-flight request and closes, and [`serve_with`]
//! returns when the last one has.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::HttpConfig;

/// The default `--max-connections`: 256, or half the soft open-file limit
/// when that is lower (the rest is left to the model's files and the
/// process), at least 8.
pub fn default_max_connections() -> usize {
    const DEFAULT: usize = 256;
    match open_file_limit() {
        Some(n) => DEFAULT.min(n / 2).max(8),
        None => DEFAULT,
    }
}

#[cfg(unix)]
fn open_file_limit() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then(|| usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX))
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<usize> {
    None
}

/// Serves `app` on `listener` with `config`'s connection limits until
/// `shutdown` resolves (see the module doc).
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    config: &HttpConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let limits = Limits::from(config);
    let registry = Arc::new(Registry::default());
    // Every connection holds a receiver: it sees the shutdown through it,
    // and the sender sees all of them dropped once the last one closes.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut accept_errors = AcceptErrors::default();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_errors.handle(&e, &registry).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let Some(activity) = registry.admit(limits.max_connections) else {
            // Every connection has a request in flight: close this one.
            drop(stream);
            continue;
        };
        let app = app.clone();
        let stop = stop_rx.clone();
        let registry = registry.clone();
        tokio::spawn(async move {
            serve_conn(stream, app, limits, &activity, stop).await;
            registry.remove(activity.id);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(stop_rx);
    stop_tx.closed().await;
    Ok(())
}

/// Accept failures: a peer that went away is skipped; anything else (most
/// often EMFILE, out of file descriptors) closes the connection that has
/// waited longest without a request and retries shortly, or waits longer
/// if none could be closed. Logged at most once a second.
#[derive(Default)]
struct AcceptErrors {
    last_log: Option<Instant>,
    suppressed: u64,
}

impl AcceptErrors {
    async fn handle(&mut self, e: &io::Error, registry: &Registry) {
        if matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
        ) {
            return;
        }
        let evicted = registry.evict_one();
        if self
            .last_log
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            let more = match self.suppressed {
                0 => String::new(),
                n => format!(" ({n} more since the last report)"),
            };
            eprintln!(
                "longhaul-server: accept failed: {e}{more}{}",
                if evicted {
                    "; closing the longest-waiting idle connection"
                } else {
                    ""
                }
            );
            self.last_log = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        // An evicted connection frees its descriptor as soon as its task
        // runs; with none to evict, wait for one to end.
        let pause = if evicted { 2 } else { 50 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// The per-connection settings taken from [`HttpConfig`].
#[derive(Clone, Copy, Debug)]
struct Limits {
    header_timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
    io_timeout: Option<Duration>,
    max_connections: usize,
}

impl From<&HttpConfig> for Limits {
    fn from(c: &HttpConfig) -> Self {
        Self {
            header_timeout: c.header_timeout,
            idle_timeout: c.idle_timeout,
            io_timeout: c.io_timeout,
            max_connections: c.max_connections.max(1),
        }
    }
}

/// One connection's state, shared by its task, its socket wrapper and the
/// registry.
struct Activity {
    id: u64,
    state: Mutex<ActivityState>,
    /// A byte arrived since the connection last became idle (set by
    /// [`ConnIo::poll_read`], cleared when a request ends).
    read: AtomicBool,
    /// Wakes the idle watcher when the connection becomes idle.
    idle: Notify,
    /// Asks the connection's task to close it now (eviction).
    kill: Notify,
}

struct ActivityState {
    /// Requests in flight (HTTP/1: 0 or 1).
    busy: u32,
    /// When `busy` last fell to 0 (or the connection opened).
    idle_since: Instant,
}

impl Activity {
    fn lock(&self) -> MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the connection waits for a request (idle, or still sending
    /// the request's headers), and since when.
    fn waiting_since(&self) -> Option<Instant> {
        let s = self.lock();
        (s.busy == 0).then_some(s.idle_since)
    }

    fn begin_request(&self) {
        self.lock().busy += 1;
    }

    fn end_request(&self) {
        let mut s = self.lock();
        s.busy = s.busy.saturating_sub(1);
        if s.busy == 0 {
            s.idle_since = Instant::now();
            self.read.store(false, Ordering::Relaxed);
            drop(s);
            self.idle.notify_one();
        }
    }

    /// Resolves once the connection has been idle, with no byte of a new
    /// request, for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let since = self.waiting_since();
            match since {
                Some(since) if !self.read.load(Ordering::Relaxed) => {
                    let deadline = since + timeout;
                    if Instant::now() >= deadline {
                        return;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = self.idle.notified() => {}
                    }
                }
                // A request is in flight or under way: wait until the
                // connection is idle again (the header timeout covers a
                // request whose headers never finish).
                _ => self.idle.notified().await,
            }
        }
    }
}

/// The open connections, for the cap and eviction.
#[derive(Default)]
struct Registry {
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Activity>>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new connection, evicting the longest-waiting one without
    /// a request in flight if `cap` connections are open; `None` if all of
    /// them have a request in flight.
    fn admit(&self, cap: usize) -> Option<Arc<Activity>> {
        let mut conns = self.lock();
        if conns.len() >= cap && !Self::evict_locked(&mut conns) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let a = Arc::new(Activity {
            id,
            state: Mutex::new(ActivityState {
                busy: 0,
                idle_since: Instant::now(),
            }),
            read: AtomicBool::new(false),
            idle: Notify::new(),
            kill: Notify::new(),
        });
        conns.insert(id, a.clone());
        Some(a)
    }

    fn evict_one(&self) -> bool {
        Self::evict_locked(&mut self.lock())
    }

    /// Closes the connection that has waited longest for a request.
    fn evict_locked(conns: &mut HashMap<u64, Arc<Activity>>) -> bool {
        let victim = conns
            .values()
            .filter_map(|a| a.waiting_since().map(|t| (t, a.id)))
            .min();
        match victim.and_then(|(_, id)| conns.remove(&id)) {
            Some(a) => {
                a.kill.notify_one();
                true
            }
            None => false,
        }
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }
}

/// Serves one connection until it closes, times out, is evicted or the
/// server shuts down.
async fn serve_conn(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    activity: &Arc<Activity>,
    mut stop: watch::Receiver<bool>,
) {
    let io = TokioIo::new(ConnIo::new(stream, activity.clone(), limits.io_timeout));
    let act = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        act.begin_request();
        let guard = RequestGuard(act.clone());
        let req = req.map(|b| Body::new(TimeoutBody::new(b, limits.io_timeout)));
        let mut app = app.clone();
        async move {
            let resp = app.call(req).await?;
            // The request stays in flight until hyper drops the response
            // body (all of it sent, or the connection gone).
            Ok::<_, std::convert::Infallible>(resp.map(|b| GuardedBody {
                inner: b,
                _guard: guard,
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let idle = async {
        match limits.idle_timeout {
            Some(t) => activity.idle_for(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(idle);
    let mut stopping = false;
    loop {
        if !stopping && *stop.borrow() {
            // Shutting down: a connection without a request in flight has
            // nothing to finish; one with a request finishes it, then closes.
            if activity.waiting_since().is_some() {
                return;
            }
            stopping = true;
            conn.as_mut().graceful_shutdown();
        }
        tokio::select! {
            // Errors here are the client's (a reset, a timeout, a malformed
            // request hyper already answered): nothing to report.
            _ = conn.as_mut() => return,
            _ = &mut idle => return,
            _ = activity.kill.notified() => return,
            r = stop.changed(), if !stopping => {
                if r.is_err() {
                    stopping = true;
                }
            }
        }
    }
}

/// Ends a request's in-flight time when dropped.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

/// A response body that holds its request's [`RequestGuard`].
struct GuardedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The error of a request body that stalled past `--timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body sent nothing for {0:?} (--timeout)")]
struct BodyTimeout(Duration);

/// A request body that fails when no data arrives for `timeout`.
struct TimeoutBody {
    inner: Incoming,
    timeout: Option<Duration>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl TimeoutBody {
    fn new(inner: Incoming, timeout: Option<Duration>) -> Self {
        Self {
            inner,
            timeout,
            sleep: None,
        }
    }
}

impl HttpBody for TimeoutBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                this.sleep = None;
                Poll::Ready(r.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let Some(t) = this.timeout else {
                    return Poll::Pending;
                };
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(t)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimeout(t).into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket as hyper sees it: reads mark the connection active (for the
/// idle timeout); a write the peer does not take for `--timeout` fails.
struct ConnIo {
    stream: TcpStream,
    activity: Arc<Activity>,
    write_timeout: Option<Duration>,
    write_sleep: Option<Pin<Box<Sleep>>>,
}

impl ConnIo {
    fn new(stream: TcpStream, activity: Arc<Activity>, write_timeout: Option<Duration>) -> Self {
        Self {
            stream,
            activity,
            write_timeout,
            write_sleep: None,
        }
    }

    /// The outcome of a write-side poll under the write timeout.
    fn timed<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.write_sleep = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let Some(t) = self.write_timeout else {
                    return Poll::Pending;
                };
                let sleep = self
                    .write_sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(t)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took nothing for {t:?} (--timeout)"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before && !self.activity.read.load(Ordering::Relaxed) {
            self.activity.read.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.timed(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.timed(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        self.timed(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.timed(cx, r)
    }
}
