//! Test fixture: real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] runs in its own temporary directory with persistence off, is killed on
//! drop, and can be killed, restarted on the same port, or paused on purpose. Commands are sent
//! over plain RESP so the fixture needs no client library and no `redis-cli`.
#![allow(dead_code, unreachable_pub)]

use std::{
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// A `redis-server` child process owned by a test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

fn server_binary() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    listener.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` cannot be started: tests that need Redis fail, never skip.
    pub fn start() -> Self {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tower-lock-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the server's temp dir");
        // A port found free can be taken before the server binds it: try a few.
        for _ in 0..5 {
            let mut server = Self {
                port: free_port(),
                dir: dir.clone(),
                child: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!(
            "redis-server did not start after 5 attempts; log:\n{}",
            Self::log(&dir)
        );
    }

    fn log(dir: &std::path::Path) -> String {
        std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
    }

    /// Spawns the process on `self.port`; returns whether it came up.
    fn spawn(&mut self) -> bool {
        let bin = server_binary();
        let child = Command::new(&bin)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "redis-server not found ({bin}: {e}): install it (Debian/Ubuntu: \
                     apt-get install redis-server) or set REDIS_SERVER_BIN"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let _ = status;
                self.child = None;
                return false;
            }
            if self
                .try_cmd(&["PING"])
                .is_some_and(|r| r == RespValue::Simple("PONG".into()))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
        false
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts a fresh one (no data) on the same port.
    ///
    /// # Panics
    /// When it does not come back within 5 s.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server did not restart on port {}; log:\n{}",
            self.port,
            Self::log(&self.dir)
        );
    }

    /// Stops the process with SIGSTOP: it keeps its sockets but answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused process with SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("server is running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Sends one command and returns the reply.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub fn cmd(&self, args: &[&str]) -> RespValue {
        self.try_cmd(args)
            .unwrap_or_else(|| panic!("redis on port {} did not answer {args:?}", self.port))
    }

    fn try_cmd(&self, args: &[&str]) -> Option<RespValue> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend(format!("${}\r\n", arg.len()).bytes());
            request.extend(arg.bytes());
            request.extend(b"\r\n");
        }
        stream.write_all(&request).ok()?;
        RespValue::read(&mut BufReader::new(stream))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused server ignores SIGKILL until... it does not: SIGKILL always works.
            self.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A RESP reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RespValue {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Int(i64),
    /// `$3\r\nabc` or a nil bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*2 ...` or a nil array.
    Array(Option<Vec<Self>>),
}

impl RespValue {
    fn read(reader: &mut impl BufRead) -> Option<Self> {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at_checked(1)?;
        Some(match kind {
            "+" => Self::Simple(rest.to_owned()),
            "-" => Self::Error(rest.to_owned()),
            ":" => Self::Int(rest.parse().ok()?),
            "$" => {
                let len: i64 = rest.parse().ok()?;
                if len < 0 {
                    Self::Bulk(None)
                } else {
                    let mut data = vec![0; len as usize + 2];
                    reader.read_exact(&mut data).ok()?;
                    data.truncate(len as usize);
                    Self::Bulk(Some(data))
                }
            }
            "*" => {
                let len: i64 = rest.parse().ok()?;
                if len < 0 {
                    Self::Array(None)
                } else {
                    let items = (0..len)
                        .map(|_| Self::read(reader))
                        .collect::<Option<_>>()?;
                    Self::Array(Some(items))
                }
            }
            _ => return None,
        })
    }

    /// The integer of an `Int` reply.
    ///
    /// # Panics
    /// For any other reply.
    pub fn as_int(&self) -> i64 {
        match self {
            Self::Int(n) => *n,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The text of a simple, error or bulk reply (`None` for nil).
    pub fn as_str(&self) -> Option<String> {
        match self {
            Self::Simple(s) | Self::Error(s) => Some(s.clone()),
            Self::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }
}
