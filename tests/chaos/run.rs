//! What every scenario shares: its seed, its counts (CI or soak), the Redis nodes it starts, its
//! history file, its one line of figures, and the report it leaves behind when it fails.

use std::{
    fmt::{Display, Write as _},
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    },
    time::Duration,
};

use tower_lock::backend::redis::redis;

use crate::{clock, history::History, support::RedisServer};

/// The run's base seed: `TOWER_LOCK_SEED`, or one taken from the clock (and printed).
pub(crate) fn base_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| match std::env::var("TOWER_LOCK_SEED") {
        Ok(seed) => {
            seed.parse().unwrap_or_else(|_| panic!("TOWER_LOCK_SEED={seed:?} is not a number"))
        }
        Err(_) => clock::now_ns() ^ u64::from(std::process::id()) << 32,
    })
}

/// Whether `TOWER_LOCK_SOAK` asks for the long counts.
pub(crate) fn soak() -> bool {
    std::env::var("TOWER_LOCK_SOAK").is_ok_and(|value| !value.is_empty() && value != "0")
}

/// `ci` in a normal run, `soak` when `TOWER_LOCK_SOAK` is set.
pub(crate) fn count(ci: usize, soak_count: usize) -> usize {
    if soak() { soak_count } else { ci }
}

/// A small deterministic generator (SplitMix64): fault schedules come from the seed alone.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[lo, hi]`.
    pub(crate) fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = u64::try_from((hi - lo).as_micros()).unwrap_or(u64::MAX);
        lo + Duration::from_micros(self.below(span + 1))
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// The `q` quantile (0..=1) of `samples` in milliseconds, 0 when there are none.
pub(crate) fn quantile_ms(samples: &[Duration], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    clock::ms(sorted[index])
}

/// The build's `target/` dir: `CARGO_TARGET_DIR`, or three levels above this test binary
/// (`target/debug/deps/chaos-*`).
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors().nth(3).expect("the test binary lives in target/<profile>/deps").to_path_buf()
}

/// Where failure reports and the figures of the last runs go.
pub(crate) fn reports_dir() -> PathBuf {
    target_dir().join("fault-reports")
}

/// A `redis-server` started for a scenario. The scenario keeps a handle too, so a failure report
/// can still read the server's log and `INFO` while the test unwinds.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    label: &'static str,
    url: String,
    /// The server's port, readable while a blocking command holds `server`.
    port: u16,
    server: Arc<Mutex<RedisServer>>,
}

impl Node {
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    fn server(&self) -> MutexGuard<'_, RedisServer> {
        // A panic elsewhere must not hide the server from the failure report.
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends one command (blocking; the fixture speaks plain RESP).
    pub(crate) fn cmd(&self, args: &[&str]) -> crate::support::RespValue {
        self.server().cmd(args)
    }

    /// `SIGKILL`, as in a crash.
    pub(crate) fn kill(&self) {
        self.server().kill();
    }

    /// A fresh, empty server on the same port.
    pub(crate) fn restart(&self) {
        self.server().restart();
    }

    /// Makes this server a replica of `master` (`REPLICAOF`); it starts syncing at once.
    pub(crate) fn replicate(&self, master: &Self) {
        // By default a master waits 5 s for more replicas before the first sync.
        master.cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        let port = master.server().port().to_string();
        let reply = self.cmd(&["REPLICAOF", "127.0.0.1", &port]);
        assert_eq!(reply.as_str().as_deref(), Some("OK"), "REPLICAOF: {reply:?}");
    }

    /// Whether this server is a replica whose link to its master is up.
    pub(crate) fn replica_in_sync(&self) -> bool {
        self.info("replication").is_some_and(|info| info.contains("master_link_status:up"))
    }

    /// `SIGSTOP`.
    pub(crate) fn pause(&self) {
        self.server().pause();
    }

    /// `SIGCONT`.
    pub(crate) fn resume(&self) {
        self.server().resume();
    }

    /// Whether the server is stalled (stopped, or busy in `DEBUG SLEEP`): an inline `PING` on a
    /// new connection gets no answer within 20 ms. The `PING` is answered after the stall.
    pub(crate) fn stalled(&self) -> bool {
        use std::io::Read as _;
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut reply = [0u8; 7];
        stream
            .set_read_timeout(Some(Duration::from_millis(20)))
            .and_then(|()| stream.write_all(b"PING\r\n"))
            .and_then(|()| stream.read(&mut reply))
            .is_err_and(|e| {
                matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
            })
    }

    /// The text of `INFO <section>`, `None` when the server does not answer within a second.
    pub(crate) fn info(&self, section: &str) -> Option<String> {
        let client = redis::Client::open(self.url.as_str()).ok()?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        redis::cmd("INFO").arg(section).query(&mut conn).ok()
    }

    /// The server's `redis_version`, as `INFO server` gives it (`7.0.15`).
    pub(crate) fn version(&self) -> String {
        let info = self.info("server").expect("INFO server");
        info.lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .expect("INFO server has redis_version")
            .trim()
            .to_owned()
    }

    /// `calls` of `cmdstat_<command>` in `INFO commandstats` (0 when it never ran).
    pub(crate) fn calls(&self, command: &str) -> u64 {
        crate::support::command_calls(&self.info("commandstats").unwrap_or_default(), command)
    }

    /// Copies the server's logs and `INFO` into `dir`.
    fn dump(&self, dir: &Path) {
        let source = self.server().dir().to_path_buf();
        for log in ["redis.log", "stderr.log"] {
            let _ = fs::copy(source.join(log), dir.join(format!("{}-{log}", self.label)));
        }
        let info = self.info("everything").unwrap_or_else(|| "(no answer)".to_owned());
        let _ = fs::write(dir.join(format!("{}-info.txt", self.label)), info);
    }
}

/// With `RUST_LOG` set, the crate's tracing events go to standard error (shown for a failed
/// test, or with `--nocapture`): what to read when a soak run fails.
fn trace_if_asked() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// The machine, shared by the scenarios that run side by side and taken whole by one that
/// asserts a latency bound: a bound on hand-off time measures this crate only when no other
/// scenario's processes compete for the cores.
static MACHINE: RwLock<()> = RwLock::new(());

/// A scenario's turn on the [`MACHINE`]: shared, or alone.
#[derive(Debug)]
enum Turn {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// One run of a scenario: see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Scenario {
    name: &'static str,
    seed: u64,
    scratch: PathBuf,
    nodes: Vec<Node>,
    figures: String,
    finished: bool,
    /// Declared last so it is let go after the nodes are stopped.
    _turn: Turn,
}

impl Scenario {
    /// Starts a scenario named `name` (`"F1"`, `"F9-control"`, ...), side by side with others.
    pub(crate) fn new(name: &'static str) -> Self {
        let turn = Turn::Shared(MACHINE.read().unwrap_or_else(PoisonError::into_inner));
        Self::with_turn(name, turn)
    }

    /// Starts a scenario that asserts a latency bound: it waits until the scenarios running
    /// finish, and those that start later wait for it (the lock prefers the writer waiting).
    pub(crate) fn alone(name: &'static str) -> Self {
        let turn = Turn::Alone(MACHINE.write().unwrap_or_else(PoisonError::into_inner));
        Self::with_turn(name, turn)
    }

    fn with_turn(name: &'static str, turn: Turn) -> Self {
        trace_if_asked();
        let seed = base_seed();
        let scratch = std::env::temp_dir().join(format!(
            "tower-lock-chaos-{}-{name}-{}",
            std::process::id(),
            clock::now_ns()
        ));
        fs::create_dir_all(&scratch).expect("create the scenario's scratch dir");
        Self {
            name,
            seed,
            scratch,
            nodes: Vec::new(),
            figures: String::new(),
            finished: false,
            _turn: turn,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// This scenario's random generator: the base seed mixed with the scenario's name, so each
    /// scenario repeats on its own with the same `TOWER_LOCK_SEED`.
    pub(crate) fn rng(&self) -> Rng {
        let salt = self.name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
        Rng::new(self.seed ^ salt)
    }

    /// Starts a `redis-server` for this scenario.
    pub(crate) fn redis(&mut self, label: &'static str) -> Node {
        self.redis_with(label, &[])
    }

    /// Starts a `redis-server` for this scenario with extra options, which restarts keep.
    pub(crate) fn redis_with(&mut self, label: &'static str, extra_args: &[&str]) -> Node {
        let server = RedisServer::start_with(extra_args);
        let node = Node {
            label,
            url: server.url(),
            port: server.port(),
            server: Arc::new(Mutex::new(server)),
        };
        self.nodes.push(node.clone());
        node
    }

    /// The path of the scenario's history file (shared with its holder processes).
    pub(crate) fn history_path(&self) -> PathBuf {
        self.scratch.join("history.jsonl")
    }

    /// The scenario's history, for appending from this process.
    pub(crate) fn history(&self) -> History {
        History::open(&self.history_path(), self.name)
    }

    /// Adds `name=value` to the figure line.
    pub(crate) fn figure(&mut self, name: &str, value: impl Display) {
        let _ = write!(self.figures, " {name}={value}");
    }

    /// Adds the `q` quantile of `samples`, in milliseconds with one decimal.
    pub(crate) fn figure_ms(&mut self, name: &str, samples: &[Duration], q: f64) {
        self.figure(name, format!("{:.1}", quantile_ms(samples, q)));
    }

    /// The figure line: `F1 seed=... name=value ...`.
    fn line(&self) -> String {
        format!("{} seed={}{}", self.name, self.seed, self.figures)
    }

    /// Prints the figure line and records it in `target/fault-reports/figures.txt`. Call it
    /// before the final assertions, so a failing run still shows its figures.
    pub(crate) fn report(&mut self) {
        self.finished = true;
        let line = self.line();
        println!("{line}");
        let dir = reports_dir();
        let _ = fs::create_dir_all(&dir);
        if let Ok(mut file) =
            fs::OpenOptions::new().create(true).append(true).open(dir.join("figures.txt"))
        {
            let _ = writeln!(file, "{line}");
        }
    }

    /// Writes the history, the figures and every node's logs and `INFO` to
    /// `target/fault-reports/<scenario>/<seed>/`.
    fn dump(&self) -> PathBuf {
        let dir = reports_dir().join(self.name).join(self.seed.to_string());
        let _ = fs::create_dir_all(&dir);
        let _ = fs::copy(self.history_path(), dir.join("history.jsonl"));
        let _ = fs::write(dir.join("figures.txt"), self.line() + "\n");
        for node in &self.nodes {
            node.dump(&dir);
        }
        dir
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if !self.finished {
                eprintln!("{} (failed before its figures were complete)", self.line());
            }
            let dir = self.dump();
            eprintln!(
                "{} failed: report in {} (repeat with TOWER_LOCK_SEED={})",
                self.name,
                dir.display(),
                self.seed
            );
        }
        let _ = fs::remove_dir_all(&self.scratch);
    }
}
