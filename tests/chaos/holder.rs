//! Holder processes: this test binary run again in the holder role, so a fault can pause or
//! kill a *client* rather than the test runner.
//!
//! The runner spawns `current_exe() --exact holder::holder_role` with `TOWER_LOCK_ROLE=holder`
//! and the [`Setup`] in `TOWER_LOCK_HOLDER_SETUP`, sends [`Command`]s as JSON lines on stdin and
//! reads [`Reply`]s from stdout lines starting with `@chaos ` (libtest prints its own lines too).

use std::{
    io::{BufRead, BufReader, Write as _},
    path::PathBuf,
    process::{Child, ChildStdin, Command as Process, Stdio},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{Extension, Router, extract::Path, http::StatusCode, routing::post};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, BufReader as AsyncBufReader},
    sync::mpsc,
};
use tower_lock::{
    Lease, LockClient, LockContext, LockError, LockGuard, LockLayer, Lost, MultiGuard,
    RedisBackend, key,
};

use crate::{
    checker, clock,
    history::{History, Outcome, Section},
    run::Rng,
    support::http,
    witness::Witness,
};

const ROLE: &str = "TOWER_LOCK_ROLE";
const SETUP: &str = "TOWER_LOCK_HOLDER_SETUP";
const REPLY: &str = "@chaos ";

/// The name of the lock layer a [`Command::Serve`] process runs: `POST /write/<key>` holds the
/// lock `LockClient::lock_in_namespace(SERVICE, key)` names.
pub(crate) const SERVICE: &str = "write";

/// Where a holder process connects and records.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Setup {
    pub(crate) scenario: String,
    pub(crate) url: String,
    pub(crate) witness: String,
    pub(crate) prefix: String,
    pub(crate) history: PathBuf,
    pub(crate) command_timeout_ms: u64,
    /// How long a fair-lock waiter's queue place outlives its last refresh.
    pub(crate) waiter_timeout_ms: u64,
    /// Run on a current-thread runtime, where a blocking section also stalls the watchdog.
    pub(crate) current_thread: bool,
}

/// Contention load: `tasks` tasks each run `sections` critical sections.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Load {
    pub(crate) tasks: usize,
    pub(crate) sections: usize,
    /// Share of sections on the one hot key; the rest spread over `cold_keys` keys.
    pub(crate) hot_share: f64,
    pub(crate) cold_keys: u64,
    /// The read-modify-write inside a section sleeps uniformly up to this.
    pub(crate) max_pause_us: u64,
    pub(crate) lease_ms: u64,
    pub(crate) seed: u64,
    /// Take a permit of the semaphore `key` with this many permits instead of the lock `key`:
    /// no fencing, and no witness (its entry counter admits one holder at a time).
    #[serde(default)]
    pub(crate) permits: Option<u32>,
    /// Stop starting sections once this long has passed, even short of `sections`: a load that
    /// outlasts a time-based fault schedule.
    #[serde(default)]
    pub(crate) for_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub(crate) enum Command {
    /// Run a contention load and report when it is done.
    Contend(Load),
    /// Take `key` (the fair lock with `fair`) with a watchdog lease and a fencing token, and
    /// hold it until told otherwise.
    Hold { key: String, lease_ms: u64, fair: bool },
    /// Check the held lock is not lost, say so, wait `delay_ms` (the window a fault hits), then
    /// write to the fenced store with the lock's token. `blocking` waits with
    /// `std::thread::sleep`, stalling the runtime.
    WriteAfterCheck { delay_ms: u64, enforce: bool, blocking: bool },
    /// Take the set `keys` with `lock_all` (a watchdog lease, fencing, a 30 s wait) and hold it
    /// until told otherwise. Each key's section is recorded when the set is granted and again
    /// whenever a renewal moves its deadline on, so a kill or a stop leaves what was believed.
    HoldAll { keys: Vec<String>, lease_ms: u64 },
    /// Release the held lock, or the held set.
    Release,
    /// Serve `POST /write/<key>` behind a [`LockLayer`] with fencing and a watchdog lease, and
    /// say where. The handler says `Checked` once it runs (holding the lock), then a write with
    /// the lock's token goes out `delay_ms` later and says `Wrote`.
    Serve { lease_ms: u64, delay_ms: u64 },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub(crate) enum Reply {
    Ready {
        pid: u32,
        /// The client's id, which starts every holder id it makes (`<client>:<n>`).
        #[serde(default)]
        client: String,
    },
    Done {
        completed: usize,
        errors: Vec<String>,
        leaked: usize,
    },
    Held {
        token: Option<u64>,
        t_ok: u64,
    },
    /// The set of a [`Command::HoldAll`] is held: its holder, and each key's token in the
    /// canonical order.
    HeldAll {
        holder: String,
        keys: Vec<String>,
        tokens: Vec<Option<u64>>,
        t_ok: u64,
    },
    Checked,
    Wrote {
        accepted: bool,
        t_write: u64,
    },
    Released {
        result: String,
        t_lost: Option<u64>,
    },
    Failed {
        error: String,
    },
    Serving {
        url: String,
    },
}

/// A holder process seen from the runner; killed on drop.
#[derive(Debug)]
pub(crate) struct HolderProc {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::UnboundedReceiver<Reply>,
    client: String,
}

impl HolderProc {
    /// Spawns a holder process and waits until its client is connected.
    pub(crate) async fn spawn(setup: &Setup) -> Self {
        let mut child = Process::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", "holder::holder_role", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ROLE, "holder")
            .env(SETUP, serde_json::to_string(setup).expect("setup serialises"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a holder process");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, replies) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest's `test holder::holder_role ... ` may start the first reply's line.
                if let Some((_, json)) = line.split_once(REPLY) {
                    let reply = serde_json::from_str(json).expect("a holder reply parses");
                    if sender.send(reply).is_err() {
                        break;
                    }
                }
            }
        });
        let mut holder = Self { child, stdin, replies, client: String::new() };
        match holder.reply(Duration::from_secs(10)).await {
            Reply::Ready { client, .. } => {
                holder.client = client;
                holder
            }
            other => panic!("holder process did not start: {other:?}"),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether `holder_id` was made by this process's client.
    pub(crate) fn made(&self, holder_id: &str) -> bool {
        holder_id.strip_prefix(self.client.as_str()).is_some_and(|rest| rest.starts_with(':'))
    }

    pub(crate) fn send(&mut self, command: &Command) {
        let line = serde_json::to_string(command).expect("command serialises");
        writeln!(self.stdin, "{line}").expect("write to the holder process");
        self.stdin.flush().expect("flush to the holder process");
    }

    /// The holder's next reply; fails the test after `within`.
    pub(crate) async fn reply(&mut self, within: Duration) -> Reply {
        tokio::time::timeout(within, self.replies.recv())
            .await
            .unwrap_or_else(|_| panic!("holder {} silent for {within:?}", self.pid()))
            .unwrap_or_else(|| panic!("holder {} exited", self.child.id()))
    }

    /// Sends `SIG<name>` to the process (a `STOP` returns once it stopped).
    pub(crate) fn signal(&self, name: &str) {
        crate::support::signal(self.pid(), name);
    }

    /// `SIGKILL`, and reaps the process.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HolderProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The holder role's entry point; a no-op in a normal test run.
#[test]
fn holder_role() {
    if std::env::var(ROLE).as_deref() != Ok("holder") {
        return;
    }
    let setup: Setup = serde_json::from_str(&std::env::var(SETUP).expect("holder setup"))
        .expect("holder setup parses");
    let runtime = if setup.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()
    .expect("holder runtime");
    runtime.block_on(serve(setup));
}

fn say(reply: &Reply) {
    println!("{REPLY}{}", serde_json::to_string(reply).expect("reply serialises"));
}

/// A lock this holder process holds, with the time `lost()` fired (0 = not yet).
struct Holding {
    guard: LockGuard<RedisBackend>,
    section: Section,
    lost_at: Arc<AtomicU64>,
}

/// A set this holder process holds. The guard is shared with the task that tracks its
/// deadlines; each key's section is in the canonical order, beside the time its lock's
/// `lost()` fired (0 = not yet).
struct HoldingSet {
    guard: Arc<MultiGuard<RedisBackend>>,
    sections: Arc<Mutex<Vec<Section>>>,
    lost_at: Vec<Arc<AtomicU64>>,
    /// When the set's `lost()` fired.
    set_lost_at: Arc<AtomicU64>,
    tracker: tokio::task::JoinHandle<()>,
}

/// The time `lost` resolves, once it does (0 until then).
fn lost_time(lost: Lost) -> Arc<AtomicU64> {
    let at = Arc::new(AtomicU64::new(0));
    let seen = at.clone();
    tokio::spawn(async move {
        lost.await;
        seen.store(clock::now_ns(), Ordering::SeqCst);
    });
    at
}

/// Serves commands until stdin closes.
async fn serve(setup: Setup) {
    let backend = crate::support::redis_backend(&setup.url)
        .command_timeout(Duration::from_millis(setup.command_timeout_ms))
        .connect()
        .await
        .expect("holder connects to Redis");
    let client = LockClient::builder(backend)
        .prefix(&setup.prefix)
        .waiter_timeout(Duration::from_millis(setup.waiter_timeout_ms))
        .build()
        .expect("holder client");
    let witness = Witness::connect(&setup.witness).await;
    let history = History::open(&setup.history, &setup.scenario);
    let holder = client.holder();
    say(&Reply::Ready {
        pid: std::process::id(),
        client: holder.id().rsplit_once(':').map_or("", |(id, _)| id).to_owned(),
    });
    let mut holding: Option<Holding> = None;
    let mut holding_set: Option<HoldingSet> = None;
    let mut lines = AsyncBufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let command: Command = serde_json::from_str(&line).expect("a command parses");
        let reply = match command {
            Command::Contend(load) => contend(&client, &witness, &history, &load).await,
            Command::Hold { key, lease_ms, fair } => {
                let lease = Lease::watchdog(Duration::from_millis(lease_ms));
                let mut section = history.begin(&key, "");
                let request = if fair { client.fair_lock(&key) } else { client.lock(&key) };
                match request.lease(lease).fencing().acquire().await {
                    Ok(guard) => {
                        section.t_ok = Some(clock::now_ns());
                        section.token = guard.fencing_token();
                        section.holder = guard.holder().id().to_owned();
                        let lost_at = Arc::new(AtomicU64::new(0));
                        let lost = guard.lost();
                        let at = lost_at.clone();
                        tokio::spawn(async move {
                            lost.await;
                            at.store(clock::now_ns(), Ordering::SeqCst);
                        });
                        let reply = Reply::Held {
                            token: section.token,
                            t_ok: section.t_ok.expect("just set"),
                        };
                        holding = Some(Holding { guard, section, lost_at });
                        reply
                    }
                    Err(error) => Reply::Failed { error: error.to_string() },
                }
            }
            Command::WriteAfterCheck { delay_ms, enforce, blocking } => {
                let held = holding.as_ref().expect("a lock is held");
                if held.guard.is_lost() {
                    Reply::Failed { error: "lost before the check".to_owned() }
                } else {
                    say(&Reply::Checked);
                    let delay = Duration::from_millis(delay_ms);
                    if blocking {
                        std::thread::sleep(delay);
                    } else {
                        tokio::time::sleep(delay).await;
                    }
                    let section = &held.section;
                    let token = section.token.expect("held with fencing");
                    let accepted =
                        witness.fenced_write(&section.key, &section.holder, token, enforce).await;
                    Reply::Wrote { accepted, t_write: clock::now_ns() }
                }
            }
            Command::HoldAll { keys, lease_ms } => {
                match hold_all(&client, &history, &keys, lease_ms).await {
                    Ok((set, reply)) => {
                        holding_set = Some(set);
                        reply
                    }
                    Err(error) => Reply::Failed { error },
                }
            }
            Command::Release if holding_set.is_some() => {
                release_set(holding_set.take().expect("checked"), &history).await
            }
            Command::Release => {
                let Holding { guard, mut section, lost_at } =
                    holding.take().expect("a lock is held");
                section.t_rel_inv = Some(clock::now_ns());
                let result = guard.release().await;
                section.t_rel_ok = Some(clock::now_ns());
                // A loss found by the release's clock check: give the watcher a moment to
                // record when `lost()` fired.
                for _ in 0..100 {
                    if result.is_ok() || lost_at.load(Ordering::SeqCst) != 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                section.t_lost = Some(lost_at.load(Ordering::SeqCst)).filter(|&at| at != 0);
                section.result = if result.is_ok() { Outcome::Ok } else { Outcome::Fail };
                history.record(&section);
                Reply::Released {
                    result: match result {
                        Ok(()) => "ok".to_owned(),
                        Err(error) => format!("{error:?}"),
                    },
                    t_lost: section.t_lost,
                }
            }
            Command::Serve { lease_ms, delay_ms } => Reply::Serving {
                url: http::serve(service(&client, &witness, lease_ms, delay_ms)).await,
            },
        };
        say(&reply);
    }
}

/// [`Command::HoldAll`]: takes the set and starts tracking its deadlines.
async fn hold_all(
    client: &LockClient<RedisBackend>,
    history: &History,
    keys: &[String],
    lease_ms: u64,
) -> Result<(HoldingSet, Reply), String> {
    let t_inv = clock::now_ns();
    let guard = client
        .lock_all(keys)
        .lease(Lease::watchdog(Duration::from_millis(lease_ms)))
        .fencing()
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .map_err(|error| error.to_string())?;
    let t_ok = clock::now_ns();
    let sections: Vec<Section> = guard
        .guards()
        .map(|lock| {
            let key = String::from_utf8_lossy(&lock.key().user_key()).into_owned();
            let mut section = history.begin(&key, lock.holder().id());
            section.t_inv = t_inv;
            section.t_ok = Some(t_ok);
            section.token = lock.fencing_token();
            // `t_ok` was read first: the deadline is never later than the guard's.
            section.t_deadline = Some(deadline(t_ok, lock.remaining()));
            history.record(&section);
            section
        })
        .collect();
    let reply = Reply::HeldAll {
        holder: guard.holder().id().to_owned(),
        keys: sections.iter().map(|s| s.key.clone()).collect(),
        tokens: sections.iter().map(|s| s.token).collect(),
        t_ok,
    };
    let lost_at = guard.guards().map(|lock| lost_time(lock.lost())).collect();
    let set_lost_at = lost_time(guard.lost());
    let guard = Arc::new(guard);
    let sections = Arc::new(Mutex::new(sections));
    let tracker = tokio::spawn(track_deadlines(guard.clone(), sections.clone(), history.clone()));
    let set = HoldingSet { guard, sections, lost_at, set_lost_at, tracker };
    Ok((set, reply))
}

/// Records a key's section again whenever a renewal moved its deadline on. There is no
/// renewal event to await, so the guards are read every 2 ms: a renewal answered in the last
/// 2 ms before a `SIGSTOP` is missed, which makes the recorded deadline early (it can hide an
/// overlap, never invent one).
async fn track_deadlines(
    guard: Arc<MultiGuard<RedisBackend>>,
    sections: Arc<Mutex<Vec<Section>>>,
    history: History,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut sections = sections.lock().unwrap_or_else(PoisonError::into_inner);
        for (lock, section) in guard.guards().zip(sections.iter_mut()) {
            // The time first: a stop between the two reads leaves nothing left (skipped)
            // rather than a deadline counted from after the stop.
            let now = clock::now_ns();
            let remaining = lock.remaining();
            if remaining.is_zero() || lock.is_lost() {
                continue;
            }
            let moved = deadline(now, remaining);
            // Jitter of the reads is not a renewal.
            if moved > section.t_deadline.unwrap_or(0) + 1_000_000 {
                section.t_deadline = Some(moved);
                history.record(section);
            }
        }
    }
}

/// [`Command::Release`] of a held set: releases it and records each key's section.
async fn release_set(set: HoldingSet, history: &History) -> Reply {
    let HoldingSet { guard, sections, lost_at, set_lost_at, tracker } = set;
    tracker.abort();
    let _ = tracker.await;
    let guard = Arc::into_inner(guard).expect("the tracker let go of the set");
    let t_rel_inv = clock::now_ns();
    let result = guard.release().await;
    let t_rel_ok = clock::now_ns();
    // As for one lock: a loss the release found by the clock may not be recorded yet.
    for _ in 0..100 {
        if result.is_ok() || set_lost_at.load(Ordering::SeqCst) != 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut sections = sections.lock().unwrap_or_else(PoisonError::into_inner);
    for (section, lost) in sections.iter_mut().zip(&lost_at) {
        section.t_rel_inv = Some(t_rel_inv);
        section.t_lost = Some(lost.load(Ordering::SeqCst)).filter(|&at| at != 0);
        section.release_returned(t_rel_ok, result.is_ok());
        history.record(section);
    }
    Reply::Released {
        result: match result {
            Ok(()) => "ok".to_owned(),
            Err(error) => format!("{error:?}"),
        },
        t_lost: Some(set_lost_at.load(Ordering::SeqCst)).filter(|&at| at != 0),
    }
}

/// The app of [`Command::Serve`].
fn service(
    client: &LockClient<RedisBackend>,
    witness: &Witness,
    lease_ms: u64,
    delay_ms: u64,
) -> Router {
    let witness = witness.clone();
    let write = move |Path(key): Path<String>, Extension(lock): Extension<LockContext>| {
        let witness = witness.clone();
        async move {
            say(&Reply::Checked);
            let token = lock.fencing_token().expect("the layer fences");
            let holder = lock.holder().id().to_owned();
            // The write runs in a task of its own, as one handed to a client library would:
            // cancelling the handler does not call it back, so only fencing can stop it.
            let write = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                let accepted = witness.fenced_write(&key, &holder, token, true).await;
                say(&Reply::Wrote { accepted, t_write: clock::now_ns() });
                accepted
            });
            if write.await.expect("the write task") { StatusCode::OK } else { StatusCode::CONFLICT }
        }
    };
    Router::new().route("/write/{key}", post(write)).route_layer(
        LockLayer::new(client.clone())
            .key(key::path_segment(1))
            .name(SERVICE)
            .lease(Lease::watchdog(Duration::from_millis(lease_ms)))
            .fencing(),
    )
}

/// Runs `load` and waits for the client to be quiet again.
async fn contend(
    client: &LockClient<RedisBackend>,
    witness: &Witness,
    history: &History,
    load: &Load,
) -> Reply {
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..load.tasks)
        .map(|task| {
            let (client, witness, history, load) =
                (client.clone(), witness.clone(), history.clone(), load.clone());
            tokio::spawn(async move {
                let mut rng =
                    Rng::new(load.seed ^ (task as u64) << 40 ^ u64::from(std::process::id()));
                let mut completed = 0;
                let mut errors = Vec::new();
                for _ in 0..load.sections {
                    if load.for_ms.is_some_and(|ms| started.elapsed().as_millis() >= u128::from(ms))
                    {
                        break;
                    }
                    let key = if rng.chance(load.hot_share) {
                        "hot".to_owned()
                    } else {
                        format!("cold{}", rng.below(load.cold_keys))
                    };
                    let pause = Duration::from_micros(rng.below(load.max_pause_us + 1));
                    let lease = Lease::watchdog(Duration::from_millis(load.lease_ms));
                    let done = match load.permits {
                        Some(permits) => {
                            permit_section(&client, &history, (&key, permits), lease, pause)
                                .await
                                .map_err(|error| match error {
                                    // The kind is what a fault scenario sorts errors by.
                                    LockError::Backend(error) => {
                                        format!("Backend({:?})", error.kind())
                                    }
                                    other => format!("{other:?}"),
                                })
                        }
                        None => section(&client, &witness, &history, &key, lease, pause)
                            .await
                            .map_err(|error| error.to_string()),
                    };
                    match done {
                        Ok(()) => completed += 1,
                        Err(error) => errors.push(format!("{key}: {error}")),
                    }
                }
                (completed, errors)
            })
        })
        .collect();
    let mut completed = 0;
    let mut errors = Vec::new();
    for task in tasks {
        let (done, failed) = task.await.expect("load task");
        completed += done;
        errors.extend(failed);
    }
    let mut leaked = checker::client_leaks(client);
    for _ in 0..200 {
        if leaked == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        leaked = checker::client_leaks(client);
    }
    Reply::Done { completed, errors, leaked }
}

/// One critical section: acquire, tell the witness, a slow read-modify-write, release; a loss
/// interrupts the work and is recorded.
async fn section(
    client: &LockClient<RedisBackend>,
    witness: &Witness,
    history: &History,
    key: &str,
    lease: Lease,
    pause: Duration,
) -> Result<(), LockError> {
    let mut section = history.begin(key, "");
    let guard =
        match client.lock(key).lease(lease).fencing().wait(Duration::from_secs(30)).acquire().await
        {
            Ok(guard) => guard,
            Err(error) => {
                section.acquire_failed(&error);
                history.record(&section);
                return Err(error);
            }
        };
    section.t_ok = Some(clock::now_ns());
    section.token = guard.fencing_token();
    section.holder = guard.holder().id().to_owned();
    witness.enter(key).await;
    tokio::select! {
        () = guard.lost() => section.t_lost = Some(clock::now_ns()),
        () = witness.increment_slowly(key, pause) => {}
    }
    witness.exit(key).await;
    section.t_rel_inv = Some(clock::now_ns());
    let result = guard.release().await;
    section.release_returned(clock::now_ns(), result.is_ok());
    history.record(&section);
    result
}

/// One permit section: acquire a permit, work (an await), give it back. The section is recorded
/// as soon as the permit is granted, again when its release is called, and at its end, so a
/// `kill -9` at any point leaves a record of what it believed. It carries the deadline the
/// guard promised: a process paused past it only learns of the loss once it runs again, but
/// may not believe it holds meanwhile.
async fn permit_section(
    client: &LockClient<RedisBackend>,
    history: &History,
    (key, permits): (&str, u32),
    lease: Lease,
    pause: Duration,
) -> Result<(), LockError> {
    let mut section = history.begin(key, "");
    let acquired =
        client.semaphore(key, permits).lease(lease).wait(Duration::from_secs(30)).acquire().await;
    let guard = match acquired {
        Ok(guard) => guard,
        Err(error) => {
            section.acquire_failed(&error);
            history.record(&section);
            return Err(error);
        }
    };
    let t_ok = clock::now_ns();
    section.t_ok = Some(t_ok);
    section.t_deadline = Some(deadline(t_ok, guard.remaining()));
    section.holder = guard.holder().id().to_owned();
    history.record(&section);
    tokio::select! {
        () = guard.lost() => section.t_lost = Some(clock::now_ns()),
        () = tokio::time::sleep(pause) => {}
    }
    if section.t_lost.is_none() {
        let now = clock::now_ns();
        if guard.is_lost() {
            // Both were ready after a pause and the work won: the guard's clock knows anyway.
            section.t_lost = Some(now);
        } else {
            // A renewal may have moved the deadline on.
            section.t_deadline = section.t_deadline.max(Some(deadline(now, guard.remaining())));
        }
    }
    section.t_rel_inv = Some(clock::now_ns());
    // The belief ends here, whatever the release does: a kill -9 during it leaves this record.
    history.record(&section);
    let result = guard.release().await;
    section.release_returned(clock::now_ns(), result.is_ok());
    history.record(&section);
    result
}

/// `now + remaining` on the history's clock.
fn deadline(now: u64, remaining: Duration) -> u64 {
    now + u64::try_from(remaining.as_nanos()).unwrap_or(u64::MAX - now)
}
