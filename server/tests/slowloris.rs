//! Connection limits over raw loopback sockets: clients that never finish
//! their headers, idle keep-alive connections, stalled request bodies and
//! clients without the API key are all disconnected within the configured
//! timeouts, and `/health` keeps answering meanwhile, also with more slow
//! sockets open than the connection cap. Every loop is bounded and every
//! socket is closed when its task ends.

mod common;

use std::time::{Duration, Instant};

use common::*;
use longhaul_server::HttpConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a socket's closing may take beyond the timeout that closes it: the
/// server's timers, and the two cores the tests share.
const SLACK: Duration = Duration::from_millis(1500);

fn secs(s: f64) -> Option<Duration> {
    Some(Duration::from_secs_f64(s))
}

fn addr(s: &TestServer) -> String {
    s.url.trim_start_matches("http://").to_string()
}

/// How a socket ended.
#[derive(Debug)]
enum End {
    /// The server closed it (EOF or reset) this long after `since`.
    Closed(Duration),
    /// Still open at the deadline.
    Open,
}

/// Waits until the server closes `sock`, discarding anything it sends,
/// for at most `limit` after `since`. Every `drip` (if given) the client
/// sends one more header line, as a slow-loris client does to look alive.
async fn wait_closed(
    sock: &mut TcpStream,
    since: Instant,
    limit: Duration,
    drip: Option<Duration>,
) -> End {
    let mut buf = [0u8; 4096];
    let step = drip.unwrap_or(Duration::from_millis(200));
    while since.elapsed() < limit {
        match tokio::time::timeout(step, sock.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return End::Closed(since.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => {
                if drip.is_some() && sock.write_all(b"X-Drip: 1\r\n").await.is_err() {
                    return End::Closed(since.elapsed());
                }
            }
        }
    }
    End::Open
}

/// Reads one HTTP response (status line, headers, `Content-Length` body)
/// from a keep-alive connection; returns the status.
async fn read_response(sock: &mut TcpStream) -> u16 {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(10), "no response");
        if let Some(head_end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().expect("content-length"))
                .expect("a content-length");
            if data.len() >= head_end + 4 + len {
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .expect("status");
                return status;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf))
            .await
            .expect("read timed out")
            .expect("read");
        assert!(
            n > 0,
            "closed mid-response: {:?}",
            String::from_utf8_lossy(&data)
        );
        data.extend_from_slice(&buf[..n]);
    }
}

/// A client that opens a fresh connection per request, so each `/health`
/// probe has to get past the connection cap.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off_and_health_answers_past_the_cap() {
    const CAP: usize = 8;
    const N: usize = 20;
    let header = 1.5;
    let s = start(
        &fixture(),
        Opts {
            http: HttpConfig {
                header_timeout: secs(header),
                // Long, so that only the header timeout (or eviction) can
                // close these sockets.
                idle_timeout: secs(60.0),
                max_connections: CAP,
                ..HttpConfig::default()
            },
            ..Opts::default()
        },
    );
    let addr = addr(&s);
    let limit = Duration::from_secs_f64(header) + SLACK;
    let mut tasks = Vec::new();
    for i in 0..N {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let mut sock = TcpStream::connect(&addr).await.expect("connect");
            // Half a request line on some, a line and a header on others.
            let partial: &[u8] = if i % 2 == 0 {
                b"GET /v1/mod"
            } else {
                b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            };
            let _ = sock.write_all(partial).await;
            let end = wait_closed(&mut sock, t0, limit, Some(Duration::from_millis(300))).await;
            drop(sock);
            end
        }));
        // Spread the sockets over the first half-second.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // More slow sockets are open than the cap: /health still answers, each
    // probe on a connection of its own.
    let c = fresh_client();
    for _ in 0..5 {
        let (st, body) = get(&c, &format!("{}/health", s.url)).await;
        assert_eq!(st, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.expect("task") {
            End::Closed(_) => {}
            End::Open => panic!("socket {i} is still open after {limit:?}"),
        }
    }
    // The server is still fine.
    let (st, _) = get(&c, &format!("{}/health", s.url)).await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let idle = 1.0;
    let s = start(
        &fixture(),
        Opts {
            http: HttpConfig {
                idle_timeout: secs(idle),
                // Long, so that only the idle timeout can close them.
                header_timeout: secs(60.0),
                ..HttpConfig::default()
            },
            ..Opts::default()
        },
    );
    let addr = addr(&s);
    let limit = Duration::from_secs_f64(idle) + SLACK;
    // A keep-alive connection after its response.
    let mut sock = TcpStream::connect(&addr).await.expect("connect");
    sock.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_response(&mut sock).await, 200);
    // Still usable before the timeout: keep-alive works.
    tokio::time::sleep(Duration::from_secs_f64(idle / 3.0)).await;
    sock.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_response(&mut sock).await, 200);
    let t1 = Instant::now();
    match wait_closed(&mut sock, t1, limit, None).await {
        End::Closed(d) => assert!(
            d >= Duration::from_secs_f64(idle / 2.0),
            "closed after {d:?}, before the idle timeout"
        ),
        End::Open => panic!("the idle keep-alive connection is open after {limit:?}"),
    }
    drop(sock);
    // A connection that never sends a byte.
    let t0 = Instant::now();
    let mut sock = TcpStream::connect(&addr).await.expect("connect");
    match wait_closed(&mut sock, t0, limit, None).await {
        End::Closed(_) => {}
        End::Open => panic!("a silent connection is open after {limit:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_ends_within_the_timeout() {
    let io = 1.0;
    let s = start(
        &fixture(),
        Opts {
            http: HttpConfig {
                io_timeout: secs(io),
                header_timeout: secs(60.0),
                idle_timeout: secs(60.0),
                ..HttpConfig::default()
            },
            ..Opts::default()
        },
    );
    let t0 = Instant::now();
    let mut sock = TcpStream::connect(addr(&s)).await.expect("connect");
    sock.write_all(
        b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"content\": ",
    )
    .await
    .expect("write");
    let limit = Duration::from_secs_f64(io) + SLACK;
    match wait_closed(&mut sock, t0, limit, None).await {
        End::Closed(_) => {}
        End::Open => panic!("a stalled body holds its connection after {limit:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_the_key_cannot_hold_sockets() {
    let (header, idle, io) = (1.5, 1.0, 1.0);
    let s = start(
        &fixture(),
        Opts {
            http: HttpConfig {
                api_key: Some("sekrit".into()),
                header_timeout: secs(header),
                idle_timeout: secs(idle),
                io_timeout: secs(io),
                ..HttpConfig::default()
            },
            ..Opts::default()
        },
    );
    let addr = addr(&s);
    // Headers that never end (no key ever gets read).
    let limit = Duration::from_secs_f64(header) + SLACK;
    let t0 = Instant::now();
    let mut slow = TcpStream::connect(&addr).await.expect("connect");
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    let slow_end = wait_closed(&mut slow, t0, limit, Some(Duration::from_millis(300))).await;
    drop(slow);
    assert!(matches!(slow_end, End::Closed(_)), "{slow_end:?}");
    // A refused request, then the connection kept idle.
    let mut sock = TcpStream::connect(&addr).await.expect("connect");
    sock.write_all(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_response(&mut sock).await, 401);
    let limit = Duration::from_secs_f64(idle) + SLACK;
    let end = wait_closed(&mut sock, Instant::now(), limit, None).await;
    drop(sock);
    assert!(matches!(end, End::Closed(_)), "{end:?}");
    // A refused request whose body never comes.
    let mut sock = TcpStream::connect(&addr).await.expect("connect");
    sock.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    )
    .await
    .expect("write");
    let limit = Duration::from_secs_f64(io.max(idle)) + SLACK;
    let end = wait_closed(&mut sock, Instant::now(), limit, None).await;
    drop(sock);
    assert!(matches!(end, End::Closed(_)), "{end:?}");
    // /health is public and fine.
    let (st, _) = get(&fresh_client(), &format!("{}/health", s.url)).await;
    assert_eq!(st, 200);
}
