//! Test fixture: real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] runs in its own temporary directory with persistence off, is killed on
//! drop, and can be killed, restarted on the same port, or paused on purpose. Its port stays
//! claimed for its whole life (see [`claim_free_port`]), so no other test process's server takes
//! it while it is killed or restarting. Commands are sent
//! over plain RESP, so the fixture needs no client library and no `redis-cli`; it uses only std.
//!
//! With `TOWER_LOCK_TEST_ACL=1`, clients log in as the crate's limited ACL user and any ACL
//! denial fails the test (see [`acl`]).
//!
//! Shared by the integration tests (`mod support;`) and the benches
//! (`#[path = "../tests/support/mod.rs"] mod support;`); each uses a subset, hence the
//! `dead_code` allowance.
#![allow(dead_code, unreachable_pub)]

pub mod acl;
pub mod http;
pub mod logs;
pub mod sentinel;

use std::{
    ffi::{OsStr, OsString},
    fmt::Write as _,
    fs::File,
    io::{self, BufRead, BufReader, Write},
    net::{TcpListener, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Inside `impl Store for Wrapper`, the named store methods, passed on to `self.inner`
/// unchanged: `forward_to_inner!(listen, inspect, force_unlock);`, with the macro imported
/// by name (`use crate::support::forward_to_inner;`): it names itself for each method.
#[cfg(feature = "unstable-backend")]
#[allow(unused_macros)]
macro_rules! forward_to_inner {
    ($($method:ident),* $(,)?) => { $(forward_to_inner!(@ $method);)* };
    (@ renew) => {
        async fn renew(
            &self,
            renewals: &[tower_lock::backend::store::Renew<'_>],
        ) -> Result<Vec<tower_lock::backend::store::RenewReply>, tower_lock::BackendError> {
            self.inner.renew(renewals).await
        }
    };
    (@ abandon) => {
        async fn abandon(
            &self,
            grant: tower_lock::backend::store::Grant<'_>,
        ) -> Result<bool, tower_lock::BackendError> {
            self.inner.abandon(grant).await
        }
    };
    (@ leave) => {
        async fn leave(
            &self,
            key: &tower_lock::LockKey,
            holder: &str,
            kind: tower_lock::LockKind,
        ) -> Result<(), tower_lock::BackendError> {
            self.inner.leave(key, holder, kind).await
        }
    };
    (@ listen) => {
        async fn listen(
            &self,
            key: &tower_lock::LockKey,
            only_for: Option<&str>,
        ) -> Result<Self::Listener, tower_lock::BackendError> {
            self.inner.listen(key, only_for).await
        }
    };
    (@ inspect) => {
        async fn inspect(
            &self,
            key: &tower_lock::LockKey,
            kind: tower_lock::LockKind,
        ) -> Result<tower_lock::LockInfo, tower_lock::BackendError> {
            self.inner.inspect(key, kind).await
        }
    };
    (@ force_unlock) => {
        async fn force_unlock(
            &self,
            key: &tower_lock::LockKey,
            kind: tower_lock::LockKind,
        ) -> Result<tower_lock::LockInfo, tower_lock::BackendError> {
            self.inner.force_unlock(key, kind).await
        }
    };
}
#[cfg(feature = "unstable-backend")]
#[allow(unused_imports)]
pub(crate) use forward_to_inner;

pub mod cluster;
#[cfg(feature = "unstable-backend")]
pub mod granted;

pub mod kinds;
#[cfg(feature = "metrics")]
pub mod recorded;
pub mod rng;
pub mod stores;

/// How long a server gets to answer `PING` after it is spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a starting server is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// How many free ports [`RedisServer::start`] tries (another process may take a port found free
/// before the server binds it).
const START_ATTEMPTS: usize = 5;
/// Read and write timeout of [`RedisServer::cmd`].
const CMD_TIMEOUT: Duration = Duration::from_secs(5);

/// Makes the temp dir names unique within this process.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A `redis-server` child process owned by a test: started on a free loopback port with
/// persistence off, killed (and its temp dir removed) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// The loopback port, kept across [`restart`](Self::restart)s.
    port: u16,
    /// The claim on the port, kept while the server is killed or restarting (see
    /// [`claim_free_port`]).
    _claim: PortClaim,
    /// The server's working dir (`--dir`), holding `redis.log` and `stderr.log`.
    dir: PathBuf,
    /// The running process; `None` once killed.
    child: Option<Child>,
    /// Extra command-line options, kept across restarts.
    extra_args: Vec<String>,
    /// Whether `redis.conf` in the dir is passed as the config file.
    config_file: bool,
    /// Whether the process is stopped by [`pause`](Self::pause).
    paused: AtomicBool,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers `PING`.
    ///
    /// The binary is `$REDIS_SERVER_BIN`, or `redis-server` on `PATH`.
    ///
    /// # Panics
    /// When `redis-server` cannot be spawned or does not come up: tests that need Redis fail,
    /// they never skip.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server as [`start`](Self::start) does, with extra `redis-server` options
    /// (for instance `["--cluster-enabled", "yes"]`), which later restarts keep.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with(extra_args: &[&str]) -> Self {
        Self::start_configured(None, extra_args)
    }

    /// Starts a server with `config` as its config file (written to `redis.conf` in its dir,
    /// which the server may rewrite, as sentinels do) and extra options.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with_config(config: &str, extra_args: &[&str]) -> Self {
        Self::start_configured(Some(config), extra_args)
    }

    fn start_configured(config: Option<&str>, extra_args: &[&str]) -> Self {
        let mut failures = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let (port, claim) = claim_free_port();
            let dir = std::env::temp_dir().join(format!(
                "tower-lock-redis-{}-{}-{port}",
                std::process::id(),
                NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ));
            // A leftover from an earlier process with the same pid must not leak into the log.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            let mut server = Self {
                port,
                _claim: claim,
                dir,
                child: None,
                extra_args: extra_args.iter().map(|&arg| arg.to_owned()).collect(),
                config_file: config.is_some(),
                paused: AtomicBool::new(false),
            };
            if let Some(config) = config {
                std::fs::write(server.dir.join("redis.conf"), config)
                    .unwrap_or_else(|e| panic!("cannot write redis.conf: {e}"));
            }
            match server.spawn() {
                Ok(()) => return server,
                // Dropping `server` kills what is left of it and removes its dir.
                Err(failure) => {
                    let _ = writeln!(failures, "attempt {attempt} (port {port}): {failure}");
                }
            }
        }
        panic!("redis-server did not start after {START_ATTEMPTS} attempts:\n{failures}");
    }

    /// The port the server listens on (the same after a [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (holding `redis.log`), removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The URL clients connect with: `redis://127.0.0.1:<port>`, or in the ACL mode
    /// (`TOWER_LOCK_TEST_ACL=1`, see [`acl`]) `redis://towerlock:<password>@127.0.0.1:<port>`,
    /// logging in as the crate's limited user.
    pub fn url(&self) -> String {
        if acl::enabled() {
            self.url_as(acl::USER, acl::PASSWORD)
        } else {
            format!("redis://127.0.0.1:{}", self.port)
        }
    }

    /// Kills the server with SIGKILL (it gets no chance to clean up, as in a crash) and waits
    /// for it to exit. Does nothing if it is not running.
    ///
    /// # Panics
    /// In the ACL mode, when the server logged ACL denials (after killing it).
    pub fn kill(&mut self) {
        let denials = self.acl_denials();
        self.stop();
        if let Some(denials) = denials {
            panic!("{denials}");
        }
    }

    /// In the ACL mode, what is wrong with the running server's `ACL LOG` (checked before it is
    /// killed or paused, as a restart starts a fresh log): its entries, or why it could not be
    /// read. `None` when the log is empty, outside the mode, when the server is not running or
    /// paused (it was checked when paused), or while the thread panics (the test fails anyway,
    /// and a second panic in `drop` would abort).
    fn acl_denials(&self) -> Option<String> {
        if !acl::enabled()
            || self.child.is_none()
            || self.paused.load(Ordering::Relaxed)
            || std::thread::panicking()
        {
            return None;
        }
        match self.try_acl_log() {
            Ok(log) if log.is_empty() => None,
            Ok(log) => Some(format!(
                "redis-server on port {} logged ACL denials: a grant missing from the crate's \
                 ACL rules (tests/support/acl.rs and the README), or a command the test should \
                 send through `cmd`: {log:#?}",
                self.port
            )),
            Err(e) => {
                Some(format!("redis-server on port {} did not answer ACL LOG: {e}", self.port))
            }
        }
    }

    /// Kills the process, as [`kill`](Self::kill) does, without the ACL check.
    fn stop(&mut self) {
        self.paused.store(false, Ordering::Relaxed);
        if let Some(mut child) = self.child.take() {
            // SIGKILL also ends a process stopped by `pause`.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, then starts a fresh one on the same port and waits until
    /// it answers `PING`. Persistence is off, so the new server starts empty.
    ///
    /// # Panics
    /// When the server does not come back (for instance because another process took the port
    /// while it was down).
    pub fn restart(&mut self) {
        self.kill();
        let mut failures = String::new();
        for attempt in 1..=3 {
            match self.spawn() {
                Ok(()) => return,
                Err(failure) => {
                    let _ = writeln!(failures, "attempt {attempt}: {failure}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        panic!("redis-server did not restart on port {}:\n{failures}", self.port);
    }

    /// Freezes the server with SIGSTOP: its sockets stay open and connections are still
    /// accepted by the kernel, but no command is answered until [`resume`](Self::resume).
    ///
    /// # Panics
    /// When the server is not running or the signal cannot be sent.
    pub fn pause(&self) {
        if let Some(denials) = self.acl_denials() {
            panic!("{denials}");
        }
        self.signal("STOP");
        self.paused.store(true, Ordering::Relaxed);
    }

    /// Lets a server frozen by [`pause`](Self::pause) run again (SIGCONT).
    ///
    /// # Panics
    /// When the server is not running or the signal cannot be sent.
    pub fn resume(&self) {
        self.signal("CONT");
        self.paused.store(false, Ordering::Relaxed);
    }

    /// Sends one command on a new connection and returns the reply; an error reply is returned
    /// as [`RespValue::Error`], not a panic.
    ///
    /// # Panics
    /// When the server cannot be reached or does not answer within 5 s (e.g. it is paused).
    pub fn cmd(&self, args: &[&str]) -> RespValue {
        self.try_cmd(args).unwrap_or_else(|e| {
            panic!("redis-server on port {} did not answer {args:?}: {e}", self.port)
        })
    }

    /// Like [`cmd`](Self::cmd), but returns I/O failures (server down, timeout, bad reply)
    /// instead of panicking. A server this fixture killed is refused without connecting: its
    /// port is free, and another test's server may have taken it.
    pub fn try_cmd(&self, args: &[&str]) -> io::Result<RespValue> {
        if self.child.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("redis-server on port {} is not running", self.port),
            ));
        }
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(CMD_TIMEOUT))?;
        stream.set_write_timeout(Some(CMD_TIMEOUT))?;
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg.as_bytes());
            request.extend_from_slice(b"\r\n");
        }
        stream.write_all(&request)?;
        RespValue::read(&mut BufReader::new(stream))
    }

    /// Spawns `redis-server` on `self.port` and waits until it answers `PING`; on failure the
    /// process is gone and the error says why, with the server's logs.
    fn spawn(&mut self) -> Result<(), String> {
        let bin = server_bin();
        // Each run gets fresh logs, so failure messages show only this run's.
        let _ = std::fs::remove_file(self.dir.join("redis.log"));
        let stderr = File::create(self.dir.join("stderr.log"))
            .map_err(|e| format!("cannot create stderr.log: {e}"))?;
        let mut command = Command::new(&bin);
        if self.config_file {
            // The config file must come first.
            command.arg(self.dir.join("redis.conf"));
        }
        let child = command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(debug_command_args())
            // In the ACL mode the user exists before the first client connects (a restarted
            // server has no persistence, and a client reconnecting early must not be refused).
            .args(acl::startup_args(redis_version()))
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| not_found(&bin, &e));
        self.child = Some(child);
        let result = self.wait_ready();
        if result.is_err() {
            self.stop();
        }
        result.map_err(|failure| format!("{failure}\n{}", self.logs()))
    }

    /// Polls until our server answers `PING` on `self.port`.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        // A PONG may come from another server that already holds the port; ours then fails to
        // bind and exits, and its log says why.
        let mut intruder: Option<u32> = None;
        loop {
            let child = self.child.as_mut().expect("spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(match intruder {
                    None => format!("redis-server exited early ({status})"),
                    Some(other) => format!(
                        "redis-server exited early ({status}); port {} is taken by another \
                         redis-server (pid {other})",
                        self.port,
                    ),
                });
            }
            if ping(self.port).is_ok() {
                match self.server_pid() {
                    Ok(pid) if Some(pid) == self.child.as_ref().map(Child::id) => return Ok(()),
                    Ok(pid) => intruder = Some(pid),
                    Err(_) => {}
                }
            }
            if Instant::now() >= deadline {
                return Err(match intruder {
                    None => format!("redis-server did not answer PING within {READY_TIMEOUT:?}"),
                    Some(other) => {
                        format!("port {} is taken by another redis-server (pid {other})", self.port,)
                    }
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// The process id of the server answering on `self.port`: ours, or another process's
    /// that holds the port. (`INFO` works on servers and sentinels alike.)
    fn server_pid(&self) -> io::Result<u32> {
        let info = self.info("server")?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
            .ok_or_else(|| io::Error::other("INFO server has no process_id"))
    }

    /// How many times the server ran `command` (lower case; 0 when it never ran).
    pub fn calls(&self, command: &str) -> u64 {
        let stats = self
            .info("commandstats")
            .unwrap_or_else(|e| panic!("redis-server on port {} gave no INFO: {e}", self.port));
        command_calls(&stats, command)
    }

    /// The text of `INFO <section>`.
    pub fn info(&self, section: &str) -> io::Result<String> {
        match self.try_cmd(&["INFO", section])? {
            RespValue::Bulk(Some(bytes)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            other => Err(io::Error::other(format!("bad INFO reply {other:?}"))),
        }
    }

    /// The server's log file and stderr, for failure messages.
    fn logs(&self) -> String {
        let read = |name: &str| {
            std::fs::read_to_string(self.dir.join(name))
                .unwrap_or_else(|e| format!("(cannot read {name}: {e})"))
        };
        format!("--- redis.log ---\n{}\n--- stderr ---\n{}", read("redis.log"), read("stderr.log"))
    }

    /// Sends `SIG<name>` to the server (see [`signal`]).
    fn signal(&self, name: &str) {
        let child = self
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("cannot send SIG{name}: redis-server is not running"));
        signal(child.id(), name);
    }
}

impl Drop for RedisServer {
    /// Kills the server and removes its temp dir; in the ACL mode, then panics if it logged ACL
    /// denials.
    fn drop(&mut self) {
        let denials = self.acl_denials();
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(denials) = denials {
            panic!("{denials}");
        }
    }
}

/// Panics with how to get `redis-server`: tests that need Redis fail, they never skip.
fn not_found(bin: &OsStr, error: &io::Error) -> ! {
    panic!(
        "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server) or set \
         REDIS_SERVER_BIN (tried {}: {error})",
        Path::new(bin).display()
    )
}

/// `--enable-debug-command local` (allows `DEBUG` from loopback) on Redis 7 and newer; nothing
/// on older servers, which reject the option but allow `DEBUG` anyway.
fn debug_command_args() -> &'static [&'static str] {
    match redis_version().first() {
        Some(major) if *major < 7 => &[],
        _ => &["--enable-debug-command", "local"],
    }
}

/// The redis-server binary: `$REDIS_SERVER_BIN`, or `redis-server` on `PATH`.
fn server_bin() -> OsString {
    std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into())
}

/// The version of the redis-server binary as numbers, `[7, 0, 15]` (empty when it prints
/// none); read once, as every server of a run comes from the same binary.
pub fn redis_version() -> &'static [u32] {
    static VERSION: OnceLock<Vec<u32>> = OnceLock::new();
    VERSION.get_or_init(|| {
        let bin = server_bin();
        let output = Command::new(&bin)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| not_found(&bin, &e));
        // "Redis server v=7.0.15 sha=..."
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .find_map(|word| word.strip_prefix("v="))
            .map(|version| version.split('.').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default()
    })
}

/// Sends `SIG<name>` to process `pid` with the `kill` command (falling back to the shell's
/// builtin where the `kill` binary, from procps, is not installed). A `STOP` returns once every
/// thread of the process has stopped (see [`wait_stopped`]).
///
/// # Panics
/// When the signal cannot be sent, or a stopped process does not stop in time.
pub fn signal(pid: u32, name: &str) {
    let (flag, pid_arg) = (format!("-{name}"), pid.to_string());
    let status = match Command::new("kill").args([flag.as_str(), &pid_arg]).status() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Command::new("sh").args(["-c", "kill \"$0\" \"$1\"", &flag, &pid_arg]).status()
        }
        other => other,
    };
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("kill {flag} {pid} failed: {status}"),
        Err(e) => panic!("cannot run kill {flag} {pid}: {e}"),
    }
    if name == "STOP" {
        wait_stopped(pid);
    }
}

/// How long [`wait_stopped`] waits for a process's threads to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Returns once every thread of process `pid` is stopped (or the process is gone), as
/// `/proc/<pid>/task/*/stat` tells. `kill -STOP` returns once the signal is queued; the threads
/// stop only as each is next scheduled, and on a busy machine a running one can go on for
/// milliseconds: a test that takes the time of the stop must read it after this.
///
/// # Panics
/// When a thread still runs after [`STOP_TIMEOUT`].
fn wait_stopped(pid: u32) {
    let tasks = PathBuf::from(format!("/proc/{pid}/task"));
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        let Ok(entries) = std::fs::read_dir(&tasks) else {
            return;
        };
        let running = entries.filter_map(Result::ok).any(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses and may hold any.
            let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.bytes().next());
            !matches!(state, None | Some(b'T' | b't' | b'Z' | b'X'))
        });
        if !running {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} still runs {STOP_TIMEOUT:?} after SIGSTOP"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// How many ports [`claim_free_port`] looks at before it gives up.
const CLAIM_ATTEMPTS: usize = 100;

/// A port claimed for one test server: a UDP socket bound to the same loopback port number,
/// held as long as the server (the OS frees it when the process ends, however it ends).
pub type PortClaim = UdpSocket;

/// Binds 127.0.0.1:0 and returns the port the OS picked, claimed for this process's server:
/// the listener is dropped, so the port is free for the server (unless another process takes
/// it first, which callers handle), and a UDP socket bound to the same number, held until it is
/// dropped, keeps the fixture of every other test process off it (TCP and UDP ports are
/// separate, so the claim never stands in the server's way). The OS hands a TCP port freed by a
/// killed server to the next bind of any process; without the claim another test's server could
/// answer on a port whose server a test killed on purpose, and give it a quorum it should not
/// have.
fn claim_free_port() -> (u16, PortClaim) {
    for _ in 0..CLAIM_ATTEMPTS {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("bind a free loopback port")
            .port();
        if let Ok(claim) = UdpSocket::bind(("127.0.0.1", port)) {
            return (port, claim);
        }
    }
    panic!("no free loopback port without a claim after {CLAIM_ATTEMPTS} tries");
}

/// Connects to the port, sends an inline `PING` and expects `+PONG`.
fn ping(port: u16) -> io::Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"PING\r\n")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.trim_end() == "+PONG" {
        Ok(())
    } else {
        Err(io::Error::other(format!("PING answered {line:?}")))
    }
}

/// A listener on a claimed free loopback port (see [`claim_free_port`]), for a test's own
/// server that speaks Redis (a proxy, say), with its claim: no other test process's fixture
/// starts a server there while it lives.
pub fn claimed_listener() -> (TcpListener, PortClaim) {
    for _ in 0..CLAIM_ATTEMPTS {
        let (port, claim) = claim_free_port();
        // A process outside the fixture may have bound it meanwhile: claim another.
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return (listener, claim);
        }
    }
    panic!("no claimed loopback port could be bound after {CLAIM_ATTEMPTS} tries");
}

/// A RESP2 reply, as returned by [`RedisServer::cmd`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RespValue {
    /// A simple string: `+OK`.
    Simple(String),
    /// An error reply: `-ERR ...`.
    Error(String),
    /// An integer: `:1`.
    Int(i64),
    /// A bulk string (`$3\r\nabc`); `None` for the nil bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// An array (`*2 ...`); `None` for the nil array (`*-1`).
    Array(Option<Vec<Self>>),
}

impl RespValue {
    /// Reads one reply.
    fn read(reader: &mut impl BufRead) -> io::Result<Self> {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad reply {line:?}"));
        let line = line.strip_suffix("\r\n").ok_or_else(bad)?;
        let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
        let length = || rest.parse::<i64>().map_err(|_| bad());
        Ok(match kind {
            "+" => Self::Simple(rest.to_owned()),
            "-" => Self::Error(rest.to_owned()),
            ":" => Self::Int(length()?),
            "$" => match usize::try_from(length()?) {
                Err(_) => Self::Bulk(None),
                Ok(len) => {
                    let mut data = vec![0; len + 2];
                    reader.read_exact(&mut data)?;
                    data.truncate(len);
                    Self::Bulk(Some(data))
                }
            },
            "*" => match usize::try_from(length()?) {
                Err(_) => Self::Array(None),
                Ok(len) => Self::Array(Some(
                    (0..len).map(|_| Self::read(reader)).collect::<io::Result<_>>()?,
                )),
            },
            _ => return Err(bad()),
        })
    }

    /// The value of an integer reply.
    ///
    /// # Panics
    /// For any other reply.
    pub fn as_int(&self) -> i64 {
        match self {
            Self::Int(n) => *n,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The text of a simple string, error or bulk string reply (bulk bytes decoded lossily as
    /// UTF-8); `None` for nil and for integers and arrays.
    pub fn as_str(&self) -> Option<String> {
        match self {
            Self::Simple(s) | Self::Error(s) => Some(s.clone()),
            Self::Bulk(Some(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }
}

impl RedisServer {
    /// Creates or changes the ACL user `name` with `rules` (`ACL SETUSER name rules...`).
    ///
    /// # Panics
    /// When the server refuses the rules.
    pub fn acl_setuser(&self, name: &str, rules: &[&str]) {
        let args: Vec<&str> =
            ["ACL", "SETUSER", name].into_iter().chain(rules.iter().copied()).collect();
        let reply = self.cmd(&args);
        assert_eq!(reply, RespValue::Simple("OK".into()), "ACL SETUSER {name}");
    }

    /// The URL clients connect with as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}", self.port)
    }

    /// The entries of `ACL LOG` (denied commands, keys, channels and failed logins), newest
    /// first, each as its reply text.
    ///
    /// # Panics
    /// When the server cannot be reached or gives no list.
    pub fn acl_log(&self) -> Vec<String> {
        self.try_acl_log().unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port))
    }

    /// Like [`acl_log`](Self::acl_log), but returns failures instead of panicking.
    pub fn try_acl_log(&self) -> io::Result<Vec<String>> {
        match self.try_cmd(&["ACL", "LOG"])? {
            RespValue::Array(Some(entries)) => Ok(entries
                .iter()
                .map(|entry| match entry {
                    RespValue::Array(Some(fields)) => fields
                        .iter()
                        .map(|field| field.as_str().unwrap_or_else(|| format!("{field:?}")))
                        .collect::<Vec<_>>()
                        .join(" "),
                    other => format!("{other:?}"),
                })
                .collect()),
            other => Err(io::Error::other(format!("ACL LOG answered {other:?}"))),
        }
    }
}

/// The `calls` of `command` (lower case) in the text of `INFO commandstats`; 0 when it never
/// ran. Scripts' calls are counted too.
pub fn command_calls(commandstats: &str, command: &str) -> u64 {
    command_stat(commandstats, command, "calls")
}

/// One field (`calls`, `usec`, …) of `command`'s line in an `INFO commandstats` reply; 0 when
/// the command was never called.
pub fn command_stat(commandstats: &str, command: &str, field: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    let field = format!("{field}=");
    commandstats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').find_map(|part| part.strip_prefix(&field))?.parse().ok())
        .unwrap_or(0)
}

/// A Redis backend builder for a server the test started itself. Its quarantine after a
/// server's start is off: a fresh server would otherwise grant nothing for a lease (the
/// quarantine tests set their own).
pub fn redis_backend(url: impl Into<String>) -> tower_lock::RedisBackendBuilder {
    tower_lock::RedisBackend::builder(url).quarantine(Duration::ZERO)
}

/// A Redlock backend builder for nodes the test started itself, quarantine off as for
/// [`redis_backend`].
pub fn redlock_backend<I>(urls: I) -> tower_lock::RedlockBackendBuilder
where
    I: IntoIterator,
    I::Item: Into<String>,
{
    tower_lock::RedlockBackend::builder(urls).quarantine(Duration::ZERO)
}

/// The grant an owner record names (the attempt that won it), read through `cmd` (one server's
/// command function): the record at `name` (a plain or fair lock's key, a read-write lock's
/// writer) is `<attempt>` or `<attempt>~<token>`. `None` when there is none (or `name` holds
/// something else).
pub fn owner_grant(cmd: impl Fn(&[&str]) -> RespValue, name: &str) -> Option<String> {
    let record = match cmd(&["GET", name]) {
        record @ RespValue::Bulk(Some(_)) => record.as_str()?,
        _ => return None,
    };
    let grant = record.split_once('~').map_or(record.as_str(), |(grant, _)| grant);
    Some(grant.to_owned())
}

/// Whether the owner record at `name` is a grant of `holder` (an attempt `<holder>#<n>`).
pub fn owned_by(cmd: impl Fn(&[&str]) -> RespValue, name: &str, holder: &str) -> bool {
    owner_grant(cmd, name).is_some_and(|grant| attempt_of(&grant, holder))
}

/// Whether `attempt` is one of `holder`'s (`<holder>#<n>`).
pub fn attempt_of(attempt: &str, holder: &str) -> bool {
    attempt.rsplit_once('#').is_some_and(|(of, _)| of == holder)
}

/// Polls `check` every 5 ms until it holds; fails the test after `within`, saying `what` was
/// awaited.
pub async fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !check() {
        assert!(std::time::Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `PUBSUB NUMSUB channel` on `server`: how many connections it has subscribed to `channel`.
pub fn numsub(server: &RedisServer, channel: &str) -> i64 {
    match server.cmd(&["PUBSUB", "NUMSUB", channel]) {
        RespValue::Array(Some(items)) if items.len() == 2 => items[1].as_int(),
        other => panic!("unexpected PUBSUB NUMSUB reply: {other:?}"),
    }
}
