//! A TCP proxy between a client and Redis, to fault the network: pass, delay either direction,
//! blackhole (read and never forward), cut every connection, or swallow the next reply and cut
//! every connection (the command ran, its answer is lost). It can also be pointed at another
//! Redis, as a virtual IP is moved to a promoted replica.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::JoinHandle,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

/// What the proxy does with bytes, judged chunk by chunk as they arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Pass,
    /// Forward requests after `up` and replies after `down`.
    Delay {
        up: Duration,
        down: Duration,
    },
    /// Read everything, forward nothing.
    Blackhole,
}

#[derive(Debug)]
struct Shared {
    upstream: Mutex<SocketAddr>,
    mode: Mutex<Mode>,
    drop_next_reply: AtomicBool,
    /// The mode to switch to once the armed reply has been swallowed.
    after_drop: Mutex<Option<Mode>>,
    connections: Mutex<Vec<CancellationToken>>,
}

impl Shared {
    fn upstream(&self) -> SocketAddr {
        *self.upstream.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cut_all(&self) {
        let connections =
            std::mem::take(&mut *self.connections.lock().unwrap_or_else(PoisonError::into_inner));
        for connection in connections {
            connection.cancel();
        }
    }
}

/// A proxy listening on a free loopback port; stops (cutting every connection) on drop.
#[derive(Debug)]
pub(crate) struct Proxy {
    addr: SocketAddr,
    /// The claim on its port (see `support::claimed_listener`; every crate that includes this
    /// file has `support` beside it).
    _claim: super::support::PortClaim,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to the Redis at `upstream_url` (`redis://host:port`).
    pub(crate) async fn start(upstream_url: &str) -> Self {
        let upstream = address(upstream_url);
        let (listener, claim) = super::support::claimed_listener();
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let listener = TcpListener::from_std(listener).expect("a tokio listener");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            mode: Mutex::new(Mode::Pass),
            drop_next_reply: AtomicBool::new(false),
            after_drop: Mutex::new(None),
            connections: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Self { addr, _claim: claim, shared, accept }
    }

    /// The URL clients use to reach Redis through the proxy.
    pub(crate) fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub(crate) fn set(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    /// Sends new connections to the Redis at `upstream_url` and cuts the open ones.
    pub(crate) fn retarget(&self, upstream_url: &str) {
        *self.shared.upstream.lock().unwrap_or_else(PoisonError::into_inner) =
            address(upstream_url);
        self.cut();
    }

    /// Closes every open connection (new ones are accepted as before).
    pub(crate) fn cut(&self) {
        self.shared.cut_all();
    }

    /// Swallows the next reply from Redis and cuts every connection: the command ran, the
    /// client never hears so, and its other pooled connections are dead too.
    pub(crate) fn drop_next_reply(&self) {
        self.shared.drop_next_reply.store(true, Ordering::SeqCst);
    }

    /// As [`drop_next_reply`](Self::drop_next_reply), then switches to `mode` in the same
    /// step, so that whatever the client sends next meets `mode`.
    pub(crate) fn drop_next_reply_then(&self, mode: Mode) {
        *self.shared.after_drop.lock().unwrap_or_else(PoisonError::into_inner) = Some(mode);
        self.drop_next_reply();
    }

    /// Whether an armed [`drop_next_reply`](Self::drop_next_reply) has fired.
    pub(crate) fn reply_dropped(&self) -> bool {
        !self.shared.drop_next_reply.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// The `ip:port` of a `redis://ip:port` URL.
fn address(url: &str) -> SocketAddr {
    url.trim_start_matches("redis://").parse().expect("an ip:port upstream")
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        let Ok(server) = TcpStream::connect(shared.upstream()).await else {
            continue; // Redis is down: the client sees its connection closed.
        };
        let cut = CancellationToken::new();
        shared.connections.lock().unwrap_or_else(PoisonError::into_inner).push(cut.clone());
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::spawn(pump(client_read, server_write, false, shared.clone(), cut.clone()));
        tokio::spawn(pump(server_read, client_write, true, shared.clone(), cut));
    }
}

/// Copies one direction (`replies`: Redis to client), applying the mode to each chunk as it
/// arrives; a delay keeps order because chunks queue with their due time.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    replies: bool,
    shared: Arc<Shared>,
    cut: CancellationToken,
) {
    let (queue, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = {
        let cut = cut.clone();
        async move {
            while let Some((at, bytes)) = due.recv().await {
                tokio::time::sleep_until(at).await;
                if to.write_all(&bytes).await.is_err() {
                    break;
                }
            }
            cut.cancel();
        }
    };
    let reader = {
        let cut = cut.clone();
        async move {
            let mut buffer = vec![0; 16 * 1024];
            loop {
                let n = match from.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if replies && shared.drop_next_reply.swap(false, Ordering::SeqCst) {
                    cut.cancel();
                    break;
                }
                let delay = match shared.mode() {
                    Mode::Pass => Duration::ZERO,
                    Mode::Delay { up, down } => {
                        if replies {
                            down
                        } else {
                            up
                        }
                    }
                    Mode::Blackhole => continue,
                };
                if queue.send((Instant::now() + delay, buffer[..n].to_vec())).is_err() {
                    break;
                }
            }
            drop(queue); // the writer drains what is due, then ends
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = cut.cancelled() => {}
        () = writer => {}
        () = reader => {}
    }
    cut.cancel();
}
