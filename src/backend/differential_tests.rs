//! The same random programs of store calls against a real `redis-server` (the scripts) and the
//! in-memory store, compared answer by answer, and both checked against a model of the protocol
//! that knows neither.
//!
//! Each seed draws a program of [`Store`] calls by three holders on four locks (a plain lock, a
//! fair lock, a read-write lock, a semaphore of two permits), and two holders that crash after
//! their one acquire: acquires (free, contended, fair queue joins, writes, reads nested in the
//! holder's write grant or naming a stale one, permits), extends, releases (naming their grant,
//! with its token, none or a stale one; handing a plain lock to another attempt, or to one given
//! up on), undos, renewals of grants and of queue places (batched), leaving a queue, forced
//! unlocks, and time passing (short leases, short waiter timeouts). It sends writes twice (the
//! same write repeated), loses replies (the write is applied, its answer never reaches the
//! client, which recovers as the engine does: an acquire is undone, a release, a renewal or an
//! undo is sent again, a hand-off's attempt is undone and the grant released plainly), and
//! delivers writes late: an acquire after its undo, which must take nothing; releases,
//! renewals and extends naming grants that ended, which must touch nothing newer. It ends by
//! giving back everything the model says is held, leaving every place, letting the crashed
//! holders' leases run out and taking every lock once with a fresh holder.
//!
//! An acquire of an attempt the program has undone always goes through the scripts
//! (`contended`): the Redis backend's uncontended `SET NX` cannot see an undo, and its late copy
//! (a record nobody holds, which the scripts count as free) is the Redis backend's own tests'
//! subject.
//!
//! The in-memory store runs on tokio's paused clock, set at each step to the step's planned
//! time; the server runs on its own clock, and each step starts once that time has come. A
//! step is planned outside every window in which a short lease or timeout may end on one store
//! and not yet on the other (the server keeps a key through its last millisecond and counts
//! whole milliseconds), so both stores see the same history. Afterwards each step is judged:
//! if it ran past the earliest end of such a window (a machine too busy for the margins), a
//! disagreement of the server with the memory store is not reported but the program is run
//! again, at most five times in all, under new lock names. A plan that fell behind the clock
//! moves on to the present, so on a busy machine one late step does not make every step late;
//! on a machine that keeps up, a seed replays exactly. The memory store never depends on the
//! machine's speed: its answers are compared with the model exactly.
//!
//! At every step, on each store:
//!
//! - **Answers** are what the model predicts (the retry hints of refusals and the remaining
//!   leases that `inspect` reports exactly on the memory store, within how late the steps ran
//!   on the server), and the two stores agree.
//! - **Exclusion**: a grant while the model holds a conflicting live grant (a plain, fair or
//!   write record; a writer and readers; more permits than the semaphore has) is reported as
//!   such; **no stranding**: a refusal of a lock the model says is free for that holder too.
//! - **Lease**: `inspect` reports exactly the live grants and places of the model, each with the
//!   remaining lease the model gives it (the longest lease any write naming it asked for,
//!   counted from that write); no store answers for a grant whose lease ended, and on the server
//!   every key the protocol wrote has a TTL.
//! - **Fencing**: the tokens of one lock rise strictly from one grant to the next (and an extend
//!   that adds a token to a grant gives a higher one); a repeated acquire or an extend of a
//!   grant that has a token answers that token.
//! - **Wake-up**: a release, an undo or a forced unlock that frees a lock publishes
//!   `released` (a fair lock: its live queue head by name); leaving the head of a queue while
//!   the lock is free passes the wake-up on; nothing else publishes, except a queue refresh or
//!   leave that drops a dead head. The server's messages are read in full (a `PING` after each
//!   step on a subscribed connection); the memory store's through listeners for each holder.
//!
//! By default 20 seeds of 40 drawn steps run (about 25 s, most of it waiting for leases to
//! end). A failure prints the seed, the steps so far with both stores' answers, and the model:
//!
//! ```text
//! DIFFERENTIAL_SEED=17 cargo test --lib --all-features differential -- --nocapture
//! DIFFERENTIAL_SEEDS=500 cargo test --lib --all-features differential   # more seeds (soak)
//! DIFFERENTIAL_FIRST_SEED=1000 DIFFERENTIAL_STEPS=80 ...                # other seeds, longer
//! ```

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fmt::{self, Write as _},
    io::{BufRead, BufReader, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use futures_util::FutureExt as _;

use crate::{
    backend::{
        Listener, LockKind,
        memory::MemoryBackend,
        redis::RedisBackend,
        store::{
            AcquireReply, Extend, ExtendReply, Grant, Listen, Release, ReleaseReply, Renew,
            RenewReply, Store,
        },
    },
    error::BackendError,
    inspect::LockInfo,
    lease::Lease,
    lock_key::LockKey,
    test_support::{self as support, RedisServer, RespValue, rng::Rng},
};

use LockKind::{Exclusive, Fair, Read, Semaphore, Write};

/// A short lease or waiter timeout: ends during a program.
const SHORT: Duration = Duration::from_millis(100);
/// A lease that ends later than the short ones.
const MEDIUM: Duration = Duration::from_millis(260);
/// A long lease or waiter timeout: never ends during a program.
const LONG: Duration = Duration::from_secs(60);
/// The semaphore's permits.
const PERMITS: u32 = 2;
/// The key prefix (one the fixture's ACL user may use).
const PREFIX: &str = "tl:";

/// How much earlier than planned a lease may end on the server: it counts from its own clock,
/// read in whole milliseconds (a `SET … PXAT` from a lower bound of it).
const EARLY: Duration = Duration::from_millis(5);
/// How much later than planned a lease may end on the server, beyond how late the step that
/// set it ran: the server keeps a key through its last millisecond.
const LATE: Duration = Duration::from_millis(10);
/// How late a step may run on the server for the plan's windows to cover it. A step that ran
/// later is judged by its real times.
const LAG: Duration = Duration::from_millis(25);
/// How many times a program runs in all when the server disagrees only after steps that ran
/// into a lease's end (a machine too busy for the margins).
const TRIES: u32 = 5;
/// How long the plan leaves a step before a lease's end: about what a step takes on a busy
/// machine (the call and the reads after it).
const STEP: Duration = Duration::from_millis(15);
/// How far behind its plan a program may fall before the plan moves on to the present. On a
/// machine that keeps up, the plan (and so a seed's replay) never depends on it.
const CATCH_UP: Duration = Duration::from_millis(15);

const HOLDERS: [&str; 3] = ["h1", "h2", "h3"];
/// Holders that crash after their one acquire: what it took runs out.
const CRASHING: [&str; 2] = ["c1", "c2"];
/// Fresh holders taking every lock at the end.
const PROBES: [&str; 5] = ["p1", "p2", "p3", "p4", "p5"];
const KINDS: [LockKind; 5] = [Exclusive, Fair, Read, Write, Semaphore];

/// One of the program's four locks (layouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Lk {
    Plain,
    Fair,
    Rw,
    Sem,
}

const LOCKS: [Lk; 4] = [Lk::Plain, Lk::Fair, Lk::Rw, Lk::Sem];

impl Lk {
    fn of(kind: LockKind) -> Self {
        match kind {
            Exclusive => Self::Plain,
            Fair => Self::Fair,
            Read | Write => Self::Rw,
            _ => Self::Sem,
        }
    }

    /// The kind its layout is read and cleared as.
    fn kind(self) -> LockKind {
        match self {
            Self::Plain => Exclusive,
            Self::Fair => Fair,
            Self::Rw => Write,
            Self::Sem => Semaphore,
        }
    }

    /// The kind of its owner record, as `inspect` reports it (a fair grant is not marked).
    fn owner_side(self) -> LockKind {
        match self {
            Self::Rw => Write,
            _ => Exclusive,
        }
    }

    /// The kind of its shared grants.
    fn shared_kind(self) -> LockKind {
        match self {
            Self::Rw => Read,
            _ => Semaphore,
        }
    }
}

/// The four locks of one try of a program (a try again uses new names).
struct Keys([LockKey; 4]);

impl Keys {
    fn new(seed: u64, try_: u32) -> Self {
        let name = format!("{seed}.{try_}");
        let base = LockKey::new(PREFIX, name.as_bytes(), 512).expect("a valid key");
        Self([
            base.with_suffix(":x"),
            base.with_suffix(":fair"),
            base.with_suffix(":rw"),
            base.with_suffix(":sem"),
        ])
    }

    fn of(&self, lock: Lk) -> &LockKey {
        &self.0[lock as usize]
    }

    /// The lock whose release channel is `channel`.
    fn channel(&self, channel: &str) -> Option<Lk> {
        LOCKS.into_iter().find(|lock| self.of(*lock).derived(":released") == channel)
    }
}

/// An acquire as sent, kept so that it can be sent again, late, or undone.
#[derive(Clone, Debug)]
struct Sent {
    holder: String,
    kind: LockKind,
    attempt: String,
    lease: Duration,
    fencing: bool,
    queue: Option<Duration>,
    contended: bool,
    within: Option<String>,
}

impl Sent {
    fn grant<'a>(&'a self, key: &'a LockKey) -> Grant<'a> {
        Grant {
            key,
            holder: &self.holder,
            attempt: &self.attempt,
            lease: Lease::fixed(self.lease),
            fencing: self.fencing,
            kind: self.kind,
            queue: self.queue,
            contended: self.contended,
            permits: PERMITS,
            within: self.within.as_deref(),
        }
    }
}

/// The token a release sends: the one its store gave the grant (none if it gave none), none,
/// or one lower than the store gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TokenArg {
    Known,
    Omitted,
    Stale,
}

/// One entry of a renewal batch.
#[derive(Clone, Debug)]
enum Entry {
    Grant { kind: LockKind, grant: String, lease: Duration },
    Place { kind: LockKind, holder: String, timeout: Duration },
}

/// One store call (or time passing).
#[derive(Clone, Debug)]
enum Op {
    Acquire(Sent),
    Abandon(Sent),
    Extend {
        kind: LockKind,
        grant: String,
        lease: Duration,
        fencing: bool,
    },
    Release {
        kind: LockKind,
        grant: String,
        token: TokenArg,
        handoff: Option<Sent>,
    },
    Renew(Vec<Entry>),
    Leave {
        holder: String,
        kind: LockKind,
    },
    ForceUnlock(LockKind),
    /// Every short lease and timeout runs out.
    Expire,
}

impl Op {
    /// The leases and timeouts the call may set (the short ones end during the program).
    fn ends(&self) -> Vec<Duration> {
        match self {
            Self::Acquire(sent) => [Some(sent.lease), sent.queue].into_iter().flatten().collect(),
            Self::Abandon(sent) => vec![sent.lease],
            Self::Extend { lease, .. } => vec![*lease],
            Self::Release { handoff, .. } => handoff.iter().map(|sent| sent.lease).collect(),
            Self::Renew(entries) => entries
                .iter()
                .map(|entry| match entry {
                    Entry::Grant { lease, .. } => *lease,
                    Entry::Place { timeout, .. } => *timeout,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The attempt an acquire sends, if it is one (for the undos the program sent).
    fn acquire_mut(&mut self) -> Option<&mut Sent> {
        match self {
            Self::Acquire(sent) => Some(sent),
            _ => None,
        }
    }
}

fn ms(duration: Duration) -> String {
    match duration {
        LONG => "long".to_owned(),
        _ => format!("{}ms", duration.as_millis()),
    }
}

impl fmt::Display for Sent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} lease {}", self.attempt, self.kind, ms(self.lease))?;
        if self.fencing {
            write!(f, " fenced")?;
        }
        if let Some(queue) = self.queue {
            write!(f, " queue {}", ms(queue))?;
        }
        if self.contended {
            write!(f, " contended")?;
        }
        if let Some(within) = &self.within {
            write!(f, " within {within}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acquire(sent) => write!(f, "acquire {sent}"),
            Self::Abandon(sent) => write!(f, "undo {sent}"),
            Self::Extend { kind, grant, lease, fencing } => {
                write!(f, "extend {grant} {kind:?} to {} fencing {fencing}", ms(*lease))
            }
            Self::Release { kind, grant, token, handoff } => {
                write!(f, "release {grant} {kind:?} token {token:?}")?;
                match handoff {
                    Some(next) => write!(f, " handing off to {next}"),
                    None => Ok(()),
                }
            }
            Self::Renew(entries) => {
                write!(f, "renew")?;
                for entry in entries {
                    match entry {
                        Entry::Grant { kind, grant, lease } => {
                            write!(f, " [{grant} {kind:?} {}]", ms(*lease))?;
                        }
                        Entry::Place { kind, holder, timeout } => {
                            write!(f, " [place {holder} {kind:?} {}]", ms(*timeout))?
                        }
                    }
                }
                Ok(())
            }
            Self::Leave { holder, kind } => write!(f, "leave {holder} {kind:?}"),
            Self::ForceUnlock(kind) => write!(f, "force unlock {kind:?}"),
            Self::Expire => write!(f, "(every short lease runs out)"),
        }
    }
}

/// Why a step is in the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Drawn,
    /// Its holder crashes once it is sent.
    Crash,
    /// Applied, its reply lost: the client recovers later.
    LostReply,
    /// The same write, sent again.
    Repeat,
    /// The client's recovery after a lost reply.
    Recovery,
    /// The undo of an acquire not yet sent.
    Forget,
    /// An acquire delivered after its undo.
    Late,
    WindUp,
    Probe,
}

#[derive(Clone, Debug)]
struct Step {
    op: Op,
    why: Why,
}

impl Step {
    fn new(op: Op, why: Why) -> Self {
        Self { op, why }
    }
}

/// A lock as `inspect` reports it: its holders (id, kind, remaining lease), sorted; its
/// queue's length; its permits in use and their limit.
#[derive(Clone, Debug, PartialEq, Eq)]
struct View {
    holders: Vec<(String, LockKind, Option<Duration>)>,
    queued: u64,
    permits: Option<(u64, u64)>,
}

impl View {
    fn of(info: &LockInfo) -> Self {
        let holders = info
            .holders
            .iter()
            .map(|holder| {
                assert_eq!(holder.hold_count, 1, "a store counts holds: {holder:?}");
                (holder.id.clone(), holder.kind, holder.remaining_lease)
            })
            .collect();
        Self::sorted(holders, info.queue_len, info.permits.map(|p| (p.in_use, p.limit)))
    }

    fn sorted(
        mut holders: Vec<(String, LockKind, Option<Duration>)>,
        queued: u64,
        permits: Option<(u64, u64)>,
    ) -> Self {
        holders.sort_by(|a, b| {
            (&a.0, format!("{:?}", a.1), a.2).cmp(&(&b.0, format!("{:?}", b.1), b.2))
        });
        Self { holders, queued, permits }
    }

    /// Equal, with remaining leases within `tolerance`.
    fn close(&self, other: &Self, tolerance: Duration) -> bool {
        self.queued == other.queued
            && self.permits == other.permits
            && self.holders.len() == other.holders.len()
            && self
                .holders
                .iter()
                .zip(&other.holders)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && within(a.2, b.2, tolerance))
    }
}

fn within(a: Option<Duration>, b: Option<Duration>, tolerance: Duration) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.abs_diff(b) <= tolerance,
        _ => false,
    }
}

/// What a store answered to a step (tokens as issued; compared by presence across stores).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    Acquired(Option<u64>),
    Held(Option<Duration>),
    Spent(Option<Duration>),
    Extended(Option<u64>),
    NotHeld,
    Released,
    HandedOff(Option<u64>),
    Undone(bool),
    Renewed(Vec<RenewReply>),
    Done,
    Forced(View),
    Error(String),
}

impl Answer {
    /// Equal, tokens by presence, retry hints and remaining leases within `tolerance`.
    fn close(&self, other: &Self, tolerance: Duration) -> bool {
        match (self, other) {
            (Self::Acquired(a), Self::Acquired(b))
            | (Self::Extended(a), Self::Extended(b))
            | (Self::HandedOff(a), Self::HandedOff(b)) => a.is_some() == b.is_some(),
            (Self::Held(a), Self::Held(b)) | (Self::Spent(a), Self::Spent(b)) => {
                within(*a, *b, tolerance)
            }
            (Self::Forced(a), Self::Forced(b)) => a.close(b, tolerance),
            _ => self == other,
        }
    }
}

/// What a step published on one lock's channel, as the memory store's listeners tell it: any
/// message, and the holders a message named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Heard {
    any: bool,
    named: BTreeSet<String>,
}

impl Heard {
    /// What listeners would have heard of `messages`.
    fn of(messages: &[String]) -> Self {
        Self {
            any: !messages.is_empty(),
            named: messages
                .iter()
                .filter(|message| tags().contains(&message.as_str()))
                .cloned()
                .collect(),
        }
    }
}

/// The holders a fair wake-up may name: listeners wait for each.
fn tags() -> Vec<&'static str> {
    HOLDERS.into_iter().chain(CRASHING).chain(PROBES).collect()
}

/// The message of a release that names no waiter.
const RELEASED: &str = "released";

/// The memory store's listeners: for each lock, one for every message and one per holder.
struct Ears(Vec<(Lk, Option<&'static str>, Listener)>);

impl Ears {
    async fn new(memory: &MemoryBackend, keys: &Keys) -> Self {
        let mut ears = Vec::new();
        for lock in LOCKS {
            let key = keys.of(lock);
            let listener = memory.listen(key, None).await.expect("listen");
            ears.push((lock, None, listener));
            for tag in tags() {
                let listener = memory.listen(key, Some(tag)).await.expect("listen");
                ears.push((lock, Some(tag), listener));
            }
        }
        Self(ears)
    }

    /// What was published since the last call, per lock.
    fn heard(&self) -> HashMap<Lk, Heard> {
        let mut heard: HashMap<Lk, Heard> = HashMap::new();
        for (lock, tag, listener) in &self.0 {
            if listener.notified().now_or_never().is_some() {
                let entry = heard.entry(*lock).or_default();
                match tag {
                    None => entry.any = true,
                    Some(tag) => {
                        entry.named.insert((*tag).to_owned());
                    }
                }
            }
        }
        heard
    }
}

/// A RESP value read off the subscriber's connection.
#[derive(Debug)]
enum Resp {
    /// A simple, error or bulk string, or an integer as text.
    Text(String),
    Nil,
    List(Vec<Self>),
}

fn read_resp(reader: &mut impl BufRead) -> std::io::Result<Resp> {
    let bad = |what: &str| std::io::Error::other(format!("bad RESP: {what}"));
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad(line))?;
    let number = || rest.parse::<i64>().map_err(|_| bad(line));
    Ok(match kind {
        "+" | "-" => Resp::Text(rest.to_owned()),
        ":" => Resp::Text(number()?.to_string()),
        "$" => match usize::try_from(number()?) {
            Err(_) => Resp::Nil,
            Ok(len) => {
                let mut data = vec![0; len + 2];
                reader.read_exact(&mut data)?;
                data.truncate(len);
                Resp::Text(String::from_utf8_lossy(&data).into_owned())
            }
        },
        "*" => match usize::try_from(number()?) {
            Err(_) => Resp::Nil,
            Ok(len) => {
                Resp::List((0..len).map(|_| read_resp(reader)).collect::<std::io::Result<_>>()?)
            }
        },
        _ => return Err(bad(line)),
    })
}

fn command(args: &[&str]) -> Vec<u8> {
    let mut bytes = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        bytes.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    bytes
}

/// A connection subscribed to the release channels of every lock of the test, read up to what
/// was published so far: a `PING` is answered after every message published before it.
struct Subscriber {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Subscriber {
    fn new(server: &RedisServer) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("a read timeout");
        let mut writer = stream.try_clone().expect("a second handle");
        let pattern = format!("{PREFIX}*");
        writer.write_all(&command(&["PSUBSCRIBE", &pattern])).expect("subscribe");
        let mut reader = BufReader::new(stream);
        read_resp(&mut reader).expect("subscribed");
        Self { writer, reader }
    }

    /// Every message published since the last call: channel and message.
    fn drain(&mut self) -> Vec<(String, String)> {
        self.writer.write_all(&command(&["PING", "end"])).expect("ping");
        let mut messages = Vec::new();
        loop {
            let Resp::List(items) = read_resp(&mut self.reader).expect("a reply") else {
                panic!("the subscriber got a reply that is not a list");
            };
            let texts: Vec<&str> = items
                .iter()
                .map(|item| match item {
                    Resp::Text(text) => text.as_str(),
                    _ => "",
                })
                .collect();
            match texts.as_slice() {
                ["pmessage", _, channel, message] => {
                    messages.push(((*channel).to_owned(), (*message).to_owned()));
                }
                ["pong", "end"] => return messages,
                other => panic!("the subscriber got {other:?}"),
            }
        }
    }
}

/// The tokens a store issued, by attempt, and the last one of each lock.
#[derive(Default)]
struct Tokens {
    of: HashMap<String, u64>,
    last: HashMap<Lk, u64>,
}

impl Tokens {
    fn resolve(&self, grant: &str, arg: TokenArg) -> Option<u64> {
        let known = self.of.get(grant).copied();
        match arg {
            TokenArg::Known => known,
            TokenArg::Omitted => None,
            TokenArg::Stale => known.map(|token| token - 1),
        }
    }

    /// Checks `token`, issued or answered as `event` says, against those issued before.
    fn check(&mut self, event: &TokenEvent, token: Option<u64>) -> Result<(), String> {
        let (lock, attempt, fresh) = match event {
            TokenEvent::New(lock, attempt) => (*lock, attempt, true),
            TokenEvent::Same(lock, attempt) => (*lock, attempt, false),
            TokenEvent::Cleared(attempt) => {
                self.of.remove(attempt);
                return Ok(());
            }
        };
        let Some(token) = token else {
            return Err(format!("no token for {attempt}, which has one"));
        };
        if !fresh {
            return match self.of.get(attempt) {
                Some(known) if *known == token => Ok(()),
                known => Err(format!("{attempt} answered token {token}, its grant has {known:?}")),
            };
        }
        if let Some(last) = self.last.get(&lock)
            && token <= *last
        {
            return Err(format!(
                "Fencing: {attempt} got token {token}, not above the last one of {lock:?}, {last}"
            ));
        }
        self.last.insert(lock, token);
        self.of.insert(attempt.clone(), token);
        Ok(())
    }
}

/// A token the model expects a store to answer with.
#[derive(Clone, Debug)]
enum TokenEvent {
    /// Issued now: higher than every earlier token of the lock.
    New(Lk, String),
    /// The token the attempt's grant already has.
    Same(Lk, String),
    /// The attempt won a grant without a token: a token its earlier grant had is not its.
    Cleared(String),
}

/// Runs `op` on `store`.
async fn perform<S: Store>(store: &S, keys: &Keys, op: &Op, tokens: &Tokens) -> Answer {
    let error = |error: BackendError| Answer::Error(format!("{:?}", error.kind()));
    match op {
        Op::Acquire(sent) => {
            let key = keys.of(Lk::of(sent.kind));
            match store.acquire(sent.grant(key)).await {
                Ok(AcquireReply::Acquired { token }) => Answer::Acquired(token),
                Ok(AcquireReply::Held { ttl }) => Answer::Held(ttl),
                Ok(AcquireReply::Spent { ttl }) => Answer::Spent(ttl),
                Err(e) => error(e),
            }
        }
        Op::Abandon(sent) => {
            let key = keys.of(Lk::of(sent.kind));
            store.abandon(sent.grant(key)).await.map_or_else(error, Answer::Undone)
        }
        Op::Extend { kind, grant, lease, fencing } => {
            let extend = Extend {
                key: keys.of(Lk::of(*kind)),
                kind: *kind,
                grant,
                lease: Lease::fixed(*lease),
                fencing: *fencing,
            };
            match store.extend(extend).await {
                Ok(ExtendReply::Extended { token }) => Answer::Extended(token),
                Ok(ExtendReply::NotHeld) => Answer::NotHeld,
                Err(e) => error(e),
            }
        }
        Op::Release { kind, grant, token, handoff } => {
            let key = keys.of(Lk::of(*kind));
            let release = Release {
                key,
                kind: *kind,
                grant,
                token: tokens.resolve(grant, *token),
                handoff: handoff.as_ref().map(|next| next.grant(key)),
            };
            match store.release(release).await {
                Ok(ReleaseReply::NotHeld) => Answer::NotHeld,
                Ok(ReleaseReply::Released { .. }) => Answer::Released,
                Ok(ReleaseReply::HandedOff { token }) => Answer::HandedOff(token),
                Err(e) => error(e),
            }
        }
        Op::Renew(entries) => {
            let renewals: Vec<Renew<'_>> = entries
                .iter()
                .map(|entry| match entry {
                    Entry::Grant { kind, grant, lease } => Renew::Grant {
                        key: keys.of(Lk::of(*kind)),
                        kind: *kind,
                        grant,
                        lease: Lease::fixed(*lease),
                    },
                    Entry::Place { kind, holder, timeout } => Renew::Place {
                        key: keys.of(Lk::of(*kind)),
                        kind: *kind,
                        holder,
                        timeout: *timeout,
                    },
                })
                .collect();
            store.renew(&renewals).await.map_or_else(error, Answer::Renewed)
        }
        Op::Leave { holder, kind } => store
            .leave(keys.of(Lk::of(*kind)), holder, *kind)
            .await
            .map_or_else(error, |()| Answer::Done),
        Op::ForceUnlock(kind) => store
            .force_unlock(keys.of(Lk::of(*kind)), *kind)
            .await
            .map_or_else(error, |info| Answer::Forced(View::of(&info))),
        Op::Expire => Answer::Done,
    }
}

/// What `store` reports of every lock.
async fn inspect_all<S: Store>(store: &S, keys: &Keys) -> Vec<Result<View, String>> {
    let mut views = Vec::new();
    for lock in LOCKS {
        let info = store.inspect(keys.of(lock), lock.kind()).await;
        views.push(info.map(|info| View::of(&info)).map_err(|e| format!("{:?}", e.kind())));
    }
    views
}

// ----------------------------------------------------------------------------------------------
// The model.

/// A lock's owner record, as the model keeps it.
#[derive(Clone, Debug)]
struct Owner {
    attempt: String,
    holder: String,
    /// Program time its lease ends (the record is gone from then on).
    end: Duration,
    token: bool,
}

/// A shared grant (a reader, a permit): present until released, undone, dropped by a script
/// that drops ended grants, cleared, or gone with its set's key.
#[derive(Clone, Debug)]
struct Member {
    attempt: String,
    holder: String,
    end: Duration,
}

/// A lock's shared grants, and when their set's key expires (`None`: no key).
#[derive(Clone, Debug, Default)]
struct Shared {
    members: Vec<Member>,
    until: Option<Duration>,
}

impl Shared {
    fn expire(&mut self, t: Duration) {
        if self.until.is_some_and(|until| until <= t) {
            *self = Self::default();
        }
    }

    fn retain(&mut self, keep: impl FnMut(&Member) -> bool) {
        self.members.retain(keep);
        if self.members.is_empty() {
            self.until = None;
        }
    }

    fn drop_ended(&mut self, t: Duration) {
        self.retain(|member| member.end > t);
    }

    /// Makes the key live `lease` more from `t`, never shorter.
    fn extend(&mut self, t: Duration, lease: Duration) {
        self.until = Some(self.until.map_or(t + lease, |until| until.max(t + lease)));
    }

    fn live(&self, t: Duration) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(move |member| member.end > t)
    }
}

/// A waiter's place in a lock's queue.
#[derive(Clone, Debug)]
struct Place {
    holder: String,
    end: Duration,
}

/// A lock's attempts given up on, and when their set's key expires.
#[derive(Clone, Debug, Default)]
struct Void {
    attempts: HashSet<String>,
    until: Duration,
}

/// What one step is expected to publish on one lock: a message it must publish, and messages
/// it may publish.
#[derive(Clone, Debug, Default)]
struct Publish {
    must: Option<String>,
    may: Option<String>,
}

/// What the model expects of a step beyond its answer.
#[derive(Default)]
struct Effects {
    publish: HashMap<Lk, Publish>,
    tokens: Vec<TokenEvent>,
}

/// The protocol's state as the answers and the clock make it, kept apart from both stores:
/// the live grants and their leases, the queue places, the attempts given up on.
#[derive(Default)]
struct Model {
    owner: HashMap<Lk, Owner>,
    shared: HashMap<Lk, Shared>,
    places: HashMap<Lk, Vec<Place>>,
    void: HashMap<Lk, Void>,
}

impl Model {
    fn owner(&self, lock: Lk, t: Duration) -> Option<&Owner> {
        self.owner.get(&lock).filter(|owner| owner.end > t)
    }

    fn shared(&mut self, lock: Lk, t: Duration) -> &mut Shared {
        let shared = self.shared.entry(lock).or_default();
        shared.expire(t);
        shared
    }

    fn live_places(&self, lock: Lk, t: Duration) -> Vec<&Place> {
        let places = self.places.get(&lock).into_iter().flatten();
        places.filter(|place| place.end > t).collect()
    }

    fn head(&self, lock: Lk, t: Duration) -> Option<Place> {
        self.live_places(lock, t).first().map(|place| (*place).clone())
    }

    fn has_place(&self, lock: Lk, holder: &str, t: Duration) -> bool {
        self.live_places(lock, t).iter().any(|place| place.holder == holder)
    }

    /// Keeps `holder`'s place (at the end of the queue if it has none) until `t + timeout`.
    fn join(&mut self, lock: Lk, holder: &str, t: Duration, timeout: Duration) {
        let places = self.places.entry(lock).or_default();
        places.retain(|place| place.end > t);
        match places.iter_mut().find(|place| place.holder == holder) {
            Some(place) => place.end = t + timeout,
            None => places.push(Place { holder: holder.to_owned(), end: t + timeout }),
        }
    }

    fn unqueue(&mut self, lock: Lk, holder: &str) {
        if let Some(places) = self.places.get_mut(&lock) {
            places.retain(|place| place.holder != holder);
        }
    }

    fn voided(&self, lock: Lk, attempt: &str, t: Duration) -> bool {
        self.void.get(&lock).is_some_and(|void| void.until > t && void.attempts.contains(attempt))
    }

    fn give_up(&mut self, lock: Lk, attempt: &str, lease: Duration, t: Duration) {
        let void = self.void.entry(lock).or_default();
        if void.until <= t {
            *void = Void::default();
        }
        void.attempts.insert(attempt.to_owned());
        void.until = void.until.max(t + lease);
    }

    /// The wake-up of a lock an owner record just left: a fair lock's live queue head, by
    /// name; otherwise (and with nobody queued) `released`.
    fn freed(&self, lock: Lk, t: Duration) -> String {
        match lock {
            Lk::Fair | Lk::Plain => {
                self.head(lock, t).map_or_else(|| RELEASED.to_owned(), |head| head.holder)
            }
            _ => RELEASED.to_owned(),
        }
    }

    /// Whether the owner side is free for a place's turn (`wait.lua`): no record, and for a
    /// writer no live reader (ended readers are dropped on the way).
    fn free_for_turn(&mut self, lock: Lk, kind: LockKind, t: Duration) -> bool {
        if self.owner(lock, t).is_some() {
            return false;
        }
        if kind == Write {
            let shared = self.shared(lock, t);
            shared.drop_ended(t);
            return shared.members.is_empty();
        }
        true
    }

    /// What `inspect` must report of `lock` at `t`.
    fn view(&mut self, lock: Lk, t: Duration) -> View {
        let mut holders = Vec::new();
        if let Some(owner) = self.owner(lock, t) {
            holders.push((owner.holder.clone(), lock.owner_side(), Some(owner.end - t)));
        }
        let live: Vec<(String, Duration)> = self
            .shared(lock, t)
            .live(t)
            .map(|member| (member.holder.clone(), member.end - t))
            .collect();
        let count = live.len() as u64;
        for (holder, left) in live {
            holders.push((holder, lock.shared_kind(), Some(left)));
        }
        let queued = match lock {
            Lk::Sem => 0,
            _ => self.live_places(lock, t).len() as u64,
        };
        let permits = (lock == Lk::Sem && count > 0).then_some((count, 0));
        View::sorted(holders, queued, permits)
    }

    /// What a fresh holder asking at `t` would get: the lock is free for it.
    fn free_for(&mut self, kind: LockKind, t: Duration) -> bool {
        let lock = Lk::of(kind);
        let owner = self.owner(lock, t).is_some();
        let head = self.head(lock, t).is_some();
        let live = self.shared(lock, t).live(t).count();
        match kind {
            Exclusive => !owner,
            Fair => !owner && !head,
            Write => !owner && !head && live == 0,
            Read => !owner && !head,
            _ => live < PERMITS as usize,
        }
    }

    /// Follows `op` at `t`: the answer the protocol gives, and what else the step must do.
    fn step(&mut self, op: &Op, t: Duration) -> (Answer, Effects) {
        let mut effects = Effects::default();
        let expected = match op {
            Op::Acquire(sent) => self.acquire(sent, t, &mut effects),
            Op::Abandon(sent) => self.abandon(sent, t, &mut effects),
            Op::Extend { kind, grant, lease, fencing } => {
                self.extend(*kind, grant, *lease, *fencing, t, &mut effects)
            }
            Op::Release { kind, grant, token, handoff } => {
                self.release(*kind, grant, *token, handoff.as_ref(), t, &mut effects)
            }
            Op::Renew(entries) => self.renew(entries, t, &mut effects),
            Op::Leave { holder, kind } => self.leave(holder, *kind, t, &mut effects),
            Op::ForceUnlock(kind) => self.force_unlock(*kind, t, &mut effects),
            Op::Expire => Answer::Done,
        };
        (expected, effects)
    }

    fn acquire(&mut self, sent: &Sent, t: Duration, effects: &mut Effects) -> Answer {
        let lock = Lk::of(sent.kind);
        if !sent.kind.owns() {
            return self.share(sent, t);
        }
        if self.voided(lock, &sent.attempt, t) {
            let ttl = self.owner(lock, t).map(|owner| owner.end - t);
            return Answer::Held(ttl);
        }
        if let Some(owner) = self.owner(lock, t)
            && owner.attempt == sent.attempt
        {
            let token = owner.token.then(|| {
                effects.tokens.push(TokenEvent::Same(lock, sent.attempt.clone()));
                0
            });
            return Answer::Acquired(token);
        }
        let mut retry = self.owner(lock, t).map(|owner| owner.end - t);
        if sent.kind != Exclusive {
            if retry.is_none() && sent.kind == Write {
                let shared = self.shared(lock, t);
                shared.drop_ended(t);
                retry = shared.members.iter().map(|member| member.end - t).min();
            }
            let head = self.head(lock, t);
            if retry.is_none()
                && let Some(head) = &head
                && head.holder != sent.holder
            {
                retry = Some(head.end - t);
            }
            if retry.is_some() {
                if let Some(timeout) = sent.queue.filter(|timeout| !timeout.is_zero()) {
                    self.join(lock, &sent.holder, t, timeout);
                }
                return Answer::Held(retry);
            }
            if head.is_some() {
                self.unqueue(lock, &sent.holder);
            }
        } else if retry.is_some() {
            return Answer::Held(retry);
        }
        self.own(lock, sent, t, effects);
        Answer::Acquired(sent.fencing.then_some(0))
    }

    /// Writes the owner record of `sent` at `t`.
    fn own(&mut self, lock: Lk, sent: &Sent, t: Duration, effects: &mut Effects) {
        effects.tokens.push(match sent.fencing {
            true => TokenEvent::New(lock, sent.attempt.clone()),
            false => TokenEvent::Cleared(sent.attempt.clone()),
        });
        self.owner.insert(
            lock,
            Owner {
                attempt: sent.attempt.clone(),
                holder: sent.holder.clone(),
                end: t + sent.lease,
                token: sent.fencing,
            },
        );
    }

    fn share(&mut self, sent: &Sent, t: Duration) -> Answer {
        let lock = Lk::of(sent.kind);
        self.shared(lock, t).drop_ended(t);
        if self.voided(lock, &sent.attempt, t) {
            return Answer::Held(None);
        }
        let shared = self.shared(lock, t);
        if shared.members.iter().any(|m| m.attempt == sent.attempt) {
            return Answer::Acquired(None);
        }
        let void = self.void.get(&lock).filter(|void| void.until > t).cloned();
        let shared = self.shared(lock, t);
        if let Some(void) = void {
            shared.retain(|member| !void.attempts.contains(&member.attempt));
        }
        let first_end = shared.members.iter().map(|member| member.end - t).min();
        let count = shared.members.len();
        if sent.kind == Semaphore {
            if count >= PERMITS as usize {
                return Answer::Held(first_end);
            }
        } else if let Some(writer) = self.owner(lock, t) {
            if sent.within.as_deref() != Some(writer.attempt.as_str()) {
                return Answer::Held(Some(writer.end - t));
            }
        } else if let Some(head) = self.head(lock, t)
            && head.holder != sent.holder
        {
            return Answer::Held(Some(head.end - t));
        }
        let shared = self.shared(lock, t);
        shared.members.push(Member {
            attempt: sent.attempt.clone(),
            holder: sent.holder.clone(),
            end: t + sent.lease,
        });
        shared.extend(t, sent.lease);
        Answer::Acquired(None)
    }

    fn abandon(&mut self, sent: &Sent, t: Duration, effects: &mut Effects) -> Answer {
        let lock = Lk::of(sent.kind);
        self.give_up(lock, &sent.attempt, sent.lease, t);
        if sent.kind.owns() {
            if self.owner(lock, t).is_none_or(|owner| owner.attempt != sent.attempt) {
                return Answer::Undone(false);
            }
            self.owner.remove(&lock);
            let message = match sent.kind {
                Fair => self.freed(lock, t),
                _ => RELEASED.to_owned(),
            };
            effects.publish.insert(lock, must(message));
            return Answer::Undone(true);
        }
        let shared = self.shared(lock, t);
        let before = shared.members.len();
        shared.retain(|member| member.attempt != sent.attempt);
        if shared.members.len() == before {
            return Answer::Undone(false);
        }
        effects.publish.insert(lock, must(RELEASED.to_owned()));
        Answer::Undone(true)
    }

    fn extend(
        &mut self,
        kind: LockKind,
        grant: &str,
        lease: Duration,
        fencing: bool,
        t: Duration,
        effects: &mut Effects,
    ) -> Answer {
        let lock = Lk::of(kind);
        if !kind.owns() {
            let shared = self.shared(lock, t);
            shared.drop_ended(t);
            let Some(member) = shared.members.iter_mut().find(|m| m.attempt == grant) else {
                return Answer::NotHeld;
            };
            member.end = member.end.max(t + lease);
            shared.extend(t, lease);
            return Answer::Extended(None);
        }
        let Some(owner) =
            self.owner.get_mut(&lock).filter(|owner| owner.end > t && owner.attempt == grant)
        else {
            return Answer::NotHeld;
        };
        owner.end = owner.end.max(t + lease);
        if fencing && !owner.token {
            owner.token = true;
            effects.tokens.push(TokenEvent::New(lock, grant.to_owned()));
        } else if owner.token {
            effects.tokens.push(TokenEvent::Same(lock, grant.to_owned()));
        }
        Answer::Extended(owner.token.then_some(0))
    }

    fn release(
        &mut self,
        kind: LockKind,
        grant: &str,
        token: TokenArg,
        handoff: Option<&Sent>,
        t: Duration,
        effects: &mut Effects,
    ) -> Answer {
        let lock = Lk::of(kind);
        if !kind.owns() {
            let shared = self.shared(lock, t);
            let before = shared.members.len();
            shared.retain(|member| member.attempt != grant);
            if shared.members.len() == before {
                return Answer::NotHeld;
            }
            effects.publish.insert(lock, must(RELEASED.to_owned()));
            return Answer::Released;
        }
        let names = self.owner(lock, t).is_some_and(|owner| {
            owner.attempt == grant && (token != TokenArg::Stale || !owner.token)
        });
        if !names {
            return Answer::NotHeld;
        }
        // Only a plain lock is handed off; the Redis backend sends the others' plainly.
        if let Some(next) =
            handoff.filter(|next| kind == Exclusive && !self.voided(lock, &next.attempt, t))
        {
            self.own(lock, next, t, effects);
            return Answer::HandedOff(next.fencing.then_some(0));
        }
        self.owner.remove(&lock);
        let message = match kind {
            Fair => self.freed(lock, t),
            _ => RELEASED.to_owned(),
        };
        effects.publish.insert(lock, must(message));
        Answer::Released
    }

    fn renew(&mut self, entries: &[Entry], t: Duration, effects: &mut Effects) -> Answer {
        let mut replies = Vec::new();
        for entry in entries {
            let reply = match entry {
                Entry::Grant { kind, grant, lease } => {
                    let lock = Lk::of(*kind);
                    if kind.owns() {
                        match self
                            .owner
                            .get_mut(&lock)
                            .filter(|owner| owner.end > t && owner.attempt == *grant)
                        {
                            Some(owner) => {
                                owner.end = owner.end.max(t + *lease);
                                RenewReply::Renewed
                            }
                            None => RenewReply::NotHeld,
                        }
                    } else {
                        let shared = self.shared(lock, t);
                        match shared
                            .members
                            .iter_mut()
                            .find(|member| member.attempt == *grant && member.end > t)
                        {
                            Some(member) => {
                                member.end = member.end.max(t + *lease);
                                shared.extend(t, *lease);
                                RenewReply::Renewed
                            }
                            None => RenewReply::NotHeld,
                        }
                    }
                }
                Entry::Place { kind, holder, timeout } => {
                    let lock = Lk::of(*kind);
                    let head = self.head(lock, t).map(|head| head.holder);
                    let free = self.free_for_turn(lock, *kind, t);
                    let reply = if self.has_place(lock, holder, t) {
                        self.join(lock, holder, t, *timeout);
                        if free && head.as_deref() == Some(holder.as_str()) {
                            RenewReply::Ready
                        } else {
                            RenewReply::Renewed
                        }
                    } else {
                        RenewReply::NotHeld
                    };
                    // A refresh does not change the live head: it publishes only when it
                    // drops a dead one before it.
                    if free || head.is_none() {
                        let message = head.unwrap_or_else(|| RELEASED.to_owned());
                        effects.publish.entry(lock).or_default().may = Some(message);
                    }
                    reply
                }
            };
            replies.push(reply);
        }
        Answer::Renewed(replies)
    }

    fn leave(
        &mut self,
        holder: &str,
        kind: LockKind,
        t: Duration,
        effects: &mut Effects,
    ) -> Answer {
        if !kind.queues() {
            // No queue to leave (the Redis backend sends nothing).
            return Answer::Done;
        }
        let lock = Lk::of(kind);
        let before = self.head(lock, t).map(|head| head.holder);
        self.unqueue(lock, holder);
        let free = self.free_for_turn(lock, kind, t);
        let after = self.head(lock, t).map(|head| head.holder);
        if free || after.is_none() {
            let message = after.clone().unwrap_or_else(|| RELEASED.to_owned());
            let publish = match before != after {
                // The live head left: its turn passes on.
                true => must(message),
                // A dead head before it may have been dropped.
                false => Publish { must: None, may: Some(message) },
            };
            effects.publish.insert(lock, publish);
        }
        Answer::Done
    }

    fn force_unlock(&mut self, kind: LockKind, t: Duration, effects: &mut Effects) -> Answer {
        let lock = Lk::of(kind);
        let before = self.view(lock, t);
        if !before.holders.is_empty() {
            self.owner.remove(&lock);
            self.shared.remove(&lock);
            let message = match lock {
                Lk::Plain | Lk::Fair => self.freed(lock, t),
                _ => RELEASED.to_owned(),
            };
            effects.publish.insert(lock, must(message));
        }
        Answer::Forced(before)
    }

    /// Steps that give back every live grant and leave every live place, as the model sees
    /// them at `t`.
    fn wind_up(&mut self, t: Duration) -> Vec<Step> {
        let mut steps = Vec::new();
        for lock in LOCKS {
            if let Some(owner) = self.owner(lock, t) {
                let kind = match lock {
                    Lk::Plain => Exclusive,
                    Lk::Fair => Fair,
                    _ => Write,
                };
                steps.push(Step::new(
                    Op::Release {
                        kind,
                        grant: owner.attempt.clone(),
                        token: TokenArg::Known,
                        handoff: None,
                    },
                    Why::WindUp,
                ));
            }
            let live: Vec<String> =
                self.shared(lock, t).live(t).map(|member| member.attempt.clone()).collect();
            for attempt in live {
                steps.push(Step::new(
                    Op::Release {
                        kind: lock.shared_kind(),
                        grant: attempt,
                        token: TokenArg::Omitted,
                        handoff: None,
                    },
                    Why::WindUp,
                ));
            }
            for place in self.live_places(lock, t) {
                let kind = match lock {
                    Lk::Fair => Fair,
                    _ => Write,
                };
                steps
                    .push(Step::new(Op::Leave { holder: place.holder.clone(), kind }, Why::WindUp));
            }
        }
        steps.push(Step::new(Op::Expire, Why::WindUp));
        steps
    }
}

fn must(message: String) -> Publish {
    Publish { must: Some(message), may: None }
}

/// Why `got` breaks the protocol where the model expected `expected`.
fn why_not(op: &Op, why: Why, expected: &Answer, got: &Answer) -> String {
    let invariant = match (op, expected, got) {
        (Op::Acquire(_), Answer::Held(_), Answer::Acquired(_)) if why == Why::Late => {
            "an acquire delivered after its undo took the lock"
        }
        (Op::Acquire(_), Answer::Held(_), Answer::Acquired(_)) => {
            "Exclusion: granted while a conflicting grant (or a waiter ahead) holds it"
        }
        (Op::Acquire(_), Answer::Acquired(_), Answer::Held(_)) => {
            "stranded: refused a lock that is free for this holder"
        }
        (_, Answer::NotHeld, Answer::Released | Answer::Extended(_) | Answer::HandedOff(_))
        | (_, Answer::Undone(false), Answer::Undone(true)) => {
            "Lease: a store answered for a grant that ended, was released, or is not named"
        }
        (_, Answer::Released | Answer::Extended(_) | Answer::HandedOff(_), Answer::NotHeld)
        | (_, Answer::Undone(true), Answer::Undone(false)) => {
            "a live grant was lost (deleted by a write that did not name it, or before its lease)"
        }
        _ => "not what the protocol answers",
    };
    format!("{invariant}: expected {expected:?}, got {got:?}")
}

// ----------------------------------------------------------------------------------------------
// The programs.

/// Draws a program's steps, remembering what was sent so that later steps can name it.
struct Program {
    rng: Rng,
    attempts: u64,
    /// Every acquire a holder sent, by holder and kind.
    sent: HashMap<(&'static str, LockKind), Vec<Sent>>,
    /// Undone before they were sent: each is sent later, late.
    forgotten: Vec<Sent>,
    /// Steps due after the drawn step of their index: repeats, recoveries, late copies.
    pending: Vec<(usize, Step)>,
    /// Attempts the program sent an undo of: an acquire of one goes through a script.
    undone: HashSet<String>,
    drawn: usize,
}

impl Program {
    fn new(seed: u64) -> Self {
        Self {
            rng: Rng(seed),
            attempts: 0,
            sent: HashMap::new(),
            forgotten: Vec::new(),
            pending: Vec::new(),
            undone: HashSet::new(),
            drawn: 0,
        }
    }

    /// The next step: one due, or a new one while fewer than `steps` were drawn.
    fn next(&mut self, steps: usize) -> Option<Step> {
        let due = match self.drawn < steps {
            true => self.pending.iter().position(|(at, _)| *at <= self.drawn),
            false => self.pending.iter().enumerate().min_by_key(|(_, (at, _))| *at).map(|(i, _)| i),
        };
        let mut step = match due {
            Some(index) => self.pending.remove(index).1,
            None if self.drawn < steps => {
                self.drawn += 1;
                self.draw()
            }
            None => return None,
        };
        if let Op::Abandon(sent) = &step.op {
            self.undone.insert(sent.attempt.clone());
        }
        // The Redis backend's uncontended `SET NX` cannot see an undo (its late copy is a
        // record nobody holds, the Redis backend's own tests' subject): an acquire of an
        // attempt given up on goes through the script, which refuses it.
        if let Some(sent) = step.op.acquire_mut()
            && self.undone.contains(&sent.attempt)
        {
            sent.contended = true;
        }
        Some(step)
    }

    fn later(&mut self, within: u64) -> usize {
        // Below `within`: the cast cannot truncate.
        self.drawn + self.rng.below(within + 1) as usize
    }

    fn lease(&mut self) -> Duration {
        match self.rng.below(20) {
            0..=6 => SHORT,
            7..=9 => MEDIUM,
            _ => LONG,
        }
    }

    fn fresh(&mut self, holder: &'static str, kind: LockKind) -> Sent {
        self.attempts += 1;
        let within = (kind == Read && self.rng.chance(0.6))
            .then(|| self.sent.get(&(holder, Write))?.last())
            .flatten()
            .map(|sent| sent.attempt.clone());
        Sent {
            holder: holder.to_owned(),
            kind,
            attempt: format!("{holder}#{}", self.attempts),
            lease: self.lease(),
            fencing: kind.owns() && self.rng.chance(0.4),
            queue: (kind.queues() && self.rng.chance(0.7))
                .then(|| if self.rng.chance(0.25) { SHORT } else { LONG }),
            contended: self.rng.chance(0.3),
            within,
        }
    }

    /// An attempt of `holder` to name: its last (most often) or an earlier one.
    fn named(&mut self, holder: &'static str, kind: LockKind) -> Option<Sent> {
        let earlier = self.sent.get(&(holder, kind))?;
        let pick = match self.rng.chance(0.6) {
            true => earlier.len() - 1,
            // Below the length: the cast cannot truncate.
            false => self.rng.below(earlier.len() as u64) as usize,
        };
        earlier.get(pick).cloned()
    }

    fn draw(&mut self) -> Step {
        let holder = self.rng.pick(&HOLDERS);
        let kind = self.rng.pick(&KINDS);
        let roll = self.rng.below(100);
        match roll {
            34..=39 => self.late_or_forget(holder, kind),
            40..=56 => self.release(holder, kind),
            57..=64 => self.extend(holder, kind),
            65..=75 => self.renew(),
            76..=83 => match self.named(holder, kind) {
                Some(sent) => {
                    let step = Step::new(Op::Abandon(sent), Why::Drawn);
                    self.lost_reply(step)
                }
                None => self.acquire(holder, kind),
            },
            84..=87 => Step::new(Op::Leave { holder: holder.to_owned(), kind }, Why::Drawn),
            88..=90 => Step::new(Op::ForceUnlock(kind), Why::Drawn),
            91..=95 => Step::new(Op::Expire, Why::Drawn),
            _ => self.acquire(holder, kind),
        }
    }

    fn acquire(&mut self, holder: &'static str, kind: LockKind) -> Step {
        if self.rng.chance(0.1) {
            // A holder that crashes once it sent its one acquire.
            let crashing = self.rng.pick(&CRASHING);
            let mut sent = self.fresh(crashing, kind);
            sent.lease = SHORT;
            sent.queue = kind.queues().then_some(SHORT);
            return Step::new(Op::Acquire(sent), Why::Crash);
        }
        let sent = self.fresh(holder, kind);
        self.sent.entry((holder, kind)).or_default().push(sent.clone());
        if self.rng.chance(0.12) {
            // Applied, its reply lost: the client undoes it, and a copy may still arrive.
            let at = self.later(3);
            self.pending.push((at, Step::new(Op::Abandon(sent.clone()), Why::Recovery)));
            if kind.queues() && sent.queue.is_some() {
                let leave = Op::Leave { holder: holder.to_owned(), kind };
                self.pending.push((at, Step::new(leave, Why::Recovery)));
            }
            if self.rng.chance(0.3) {
                let at = at + 1 + self.rng.below(3) as usize;
                self.pending.push((at, Step::new(Op::Acquire(sent.clone()), Why::Late)));
            }
            return Step::new(Op::Acquire(sent), Why::LostReply);
        }
        if self.rng.chance(0.12) {
            let at = self.later(2);
            self.pending.push((at, Step::new(Op::Acquire(sent.clone()), Why::Repeat)));
        }
        Step::new(Op::Acquire(sent), Why::Drawn)
    }

    /// An acquire delivered after its undo, or the undo of one not sent yet.
    fn late_or_forget(&mut self, holder: &'static str, kind: LockKind) -> Step {
        if !self.forgotten.is_empty() && self.rng.chance(0.5) {
            let sent = self.forgotten.remove(0);
            return Step::new(Op::Acquire(sent), Why::Late);
        }
        let sent = self.fresh(holder, kind);
        self.forgotten.push(sent.clone());
        Step::new(Op::Abandon(sent), Why::Forget)
    }

    fn release(&mut self, holder: &'static str, kind: LockKind) -> Step {
        let Some(named) = self.named(holder, kind) else {
            return self.acquire(holder, kind);
        };
        let token = match self.rng.below(10) {
            0..=4 => TokenArg::Known,
            5..=8 => TokenArg::Omitted,
            _ => TokenArg::Stale,
        };
        let handoff = (kind.owns() && self.rng.chance(0.4)).then(|| {
            if !self.forgotten.is_empty() && self.rng.chance(0.2) {
                // An attempt given up on: the lock is freed instead.
                let sent = self.forgotten.remove(0);
                return Sent { queue: None, ..sent };
            }
            let other = self.rng.pick(&HOLDERS);
            let sent = Sent { queue: None, within: None, ..self.fresh(other, kind) };
            self.sent.entry((other, kind)).or_default().push(sent.clone());
            sent
        });
        let op =
            Op::Release { kind, grant: named.attempt.clone(), token, handoff: handoff.clone() };
        if self.rng.chance(0.12) {
            // Applied, its reply lost. A hand-off's attempt is undone; the grant's delete is
            // sent again, plainly.
            let at = self.later(2);
            if let Some(next) = handoff {
                self.pending.push((at, Step::new(Op::Abandon(next), Why::Recovery)));
            }
            let again = Op::Release { kind, grant: named.attempt, token, handoff: None };
            self.pending.push((at, Step::new(again, Why::Recovery)));
            return Step::new(op, Why::LostReply);
        }
        if self.rng.chance(0.1) {
            let at = self.later(1);
            self.pending.push((at, Step::new(op.clone(), Why::Repeat)));
        }
        Step::new(op, Why::Drawn)
    }

    fn extend(&mut self, holder: &'static str, kind: LockKind) -> Step {
        let Some(named) = self.named(holder, kind) else {
            return self.acquire(holder, kind);
        };
        let op = Op::Extend {
            kind,
            grant: named.attempt,
            lease: self.lease(),
            fencing: self.rng.chance(0.3),
        };
        // A lost reply is not resolved: the grant's final delete covers what it set.
        let why = match self.rng.chance(0.12) {
            true => Why::LostReply,
            false => Why::Drawn,
        };
        if self.rng.chance(0.1) {
            let at = self.later(1);
            self.pending.push((at, Step::new(op.clone(), Why::Repeat)));
        }
        Step::new(op, why)
    }

    fn renew(&mut self) -> Step {
        let mut entries = Vec::new();
        let mut places = HashSet::new();
        for _ in 0..=self.rng.below(3) {
            let holder = self.rng.pick(&HOLDERS);
            if self.rng.chance(0.7) {
                let kind = self.rng.pick(&KINDS);
                if let Some(named) = self.named(holder, kind) {
                    let lease = if self.rng.chance(0.4) { SHORT } else { LONG };
                    entries.push(Entry::Grant { kind, grant: named.attempt, lease });
                }
                continue;
            }
            let kind = match self.rng.below(10) {
                0..=4 => Fair,
                5..=8 => Write,
                _ => self.rng.pick(&KINDS),
            };
            // One place per lock in a batch: each may publish once.
            if places.insert(Lk::of(kind)) {
                let timeout = if self.rng.chance(0.4) { SHORT } else { LONG };
                entries.push(Entry::Place { kind, holder: holder.to_owned(), timeout });
            }
        }
        let step = Step::new(Op::Renew(entries), Why::Drawn);
        self.lost_reply(step)
    }

    /// Loses the reply of `step` now and then (the client sends it again), or sends it twice.
    fn lost_reply(&mut self, step: Step) -> Step {
        if self.rng.chance(0.12) {
            let at = self.later(2);
            self.pending.push((at, Step::new(step.op.clone(), Why::Recovery)));
            return Step::new(step.op, Why::LostReply);
        }
        if self.rng.chance(0.1) {
            let at = self.later(1);
            self.pending.push((at, Step::new(step.op.clone(), Why::Repeat)));
        }
        step
    }
}

/// The plan of a program's times: each step's program time, outside the windows around the
/// ends of short leases and timeouts set so far.
#[derive(Default)]
struct Plan {
    at: Duration,
    windows: Vec<(Duration, Duration)>,
}

impl Plan {
    /// The time of a step at least `gap` after the last one, outside every window.
    fn next(&mut self, gap: Duration) -> Duration {
        let mut at = self.at + gap;
        while let Some((_, to)) = self.windows.iter().find(|(from, to)| *from <= at && at <= *to) {
            at = *to + Duration::from_micros(100);
        }
        self.windows.retain(|(_, to)| *to >= at);
        self.at = at;
        at
    }

    /// Moves the plan on to `now` when it fell behind by more than [`CATCH_UP`] (a busy
    /// machine): the memory store's clock then follows the server's again, and a plan that ran
    /// late does not make every step after it late. Outside every window, as always.
    fn catch_up(&mut self, planned: Duration, now: Duration) -> Duration {
        if now <= planned + CATCH_UP {
            return planned;
        }
        self.at = now;
        self.next(Duration::ZERO)
    }

    /// The time of a step after every short lease and timeout set so far ended.
    fn after_every_end(&mut self) -> Duration {
        let last = self.windows.iter().map(|(_, to)| *to).max();
        let gap = last.map_or(Duration::ZERO, |last| last.saturating_sub(self.at));
        self.next(gap + Duration::from_millis(1))
    }

    /// A step at `at` may set the ends of `op`. No step is planned just before one either: a
    /// step takes time, more on a busy machine.
    fn ends(&mut self, at: Duration, op: &Op) {
        for length in op.ends().into_iter().filter(|length| *length < LONG) {
            let end = at + length;
            self.windows.push((end - EARLY - STEP, end + LATE + LAG));
        }
    }
}

/// Why a program failed.
struct Failure {
    report: String,
    /// A step ran into a window where the server and the memory store may see a lease end at
    /// different points, and it is the server that disagreed: run the program again.
    overran: bool,
}

/// The server, its backend on a runtime of its own (real time), and the subscriber.
struct Fixture {
    redis: RedisBackend,
    runtime: tokio::runtime::Runtime,
    subscriber: Subscriber,
    server: RedisServer,
}

impl Fixture {
    fn start() -> Self {
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let redis =
            runtime.block_on(support::redis_backend(server.url()).connect()).expect("connect");
        let subscriber = Subscriber::new(&server);
        Self { redis, runtime, subscriber, server }
    }

    /// The keys of the test that have no TTL.
    fn keys_without_ttl(&self) -> Vec<String> {
        let script = "local found = {} \
            for _, key in ipairs(redis.call('KEYS', ARGV[1])) do \
              if redis.call('PTTL', key) == -1 then found[#found + 1] = key end \
            end \
            return found";
        let pattern = format!("{PREFIX}*");
        match self.server.cmd(&["EVAL", script, "0", &pattern]) {
            RespValue::Array(Some(keys)) => keys.iter().filter_map(RespValue::as_str).collect(),
            other => vec![format!("(the check answered {other:?})")],
        }
    }
}

/// How one program went.
#[derive(Default)]
struct Stats {
    steps: usize,
    overran: bool,
    /// How many steps of each call and of each reason for it ran.
    ran: std::collections::BTreeMap<String, usize>,
}

impl Op {
    /// The call's name, for the run's summary.
    fn name(&self) -> &'static str {
        match self {
            Self::Acquire(sent) if sent.kind.queues() && sent.queue.is_some() => "queued acquire",
            Self::Acquire(sent) if sent.within.is_some() => "nested read",
            Self::Acquire(_) => "acquire",
            Self::Abandon(_) => "undo",
            Self::Extend { .. } => "extend",
            Self::Release { handoff: Some(_), .. } => "hand-off",
            Self::Release { .. } => "release",
            Self::Renew(_) => "renew",
            Self::Leave { .. } => "leave",
            Self::ForceUnlock(_) => "force unlock",
            Self::Expire => "time passing",
        }
    }
}

/// Runs the program of `seed` (its `try_`th time) on both stores, with the model.
fn compare(seed: u64, try_: u32, fixture: &mut Fixture, steps: usize) -> Result<Stats, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a paused runtime");
    let memory = MemoryBackend::new();
    let keys = Keys::new(seed, try_);
    let ears = runtime.block_on(Ears::new(&memory, &keys));
    let origin = runtime.block_on(async { tokio::time::Instant::now() });
    fixture.subscriber.drain();
    let mut program = Program::new(seed);
    // Gaps between steps come from a generator of their own: the steps are the same however
    // they are timed.
    let mut gaps = Rng(seed ^ 0x6A09_E667_F3BC_C908);
    let mut plan = Plan::default();
    let mut model = Model::default();
    let mut tokens = (Tokens::default(), Tokens::default());
    let mut queued: Vec<Step> = Vec::new();
    let mut phase = 0;
    // Real windows around the ends set so far: (from, to) since `start`.
    let mut windows: Vec<(Duration, Duration)> = Vec::new();
    let mut tolerance = Duration::from_millis(3);
    let mut log = String::new();
    let mut stats = Stats::default();
    let start = Instant::now();
    for index in 0.. {
        let step = match queued.pop() {
            Some(step) => step,
            None => match program.next(steps) {
                Some(step) => step,
                None => {
                    phase += 1;
                    let t = plan.at;
                    match phase {
                        1 => {
                            let _ = writeln!(log, "     (the holders give back what they hold)");
                            queued = model.wind_up(t);
                        }
                        2 => {
                            let _ = writeln!(log, "     (every lock is taken by a fresh holder)");
                            for (kind, probe) in KINDS.into_iter().zip(PROBES) {
                                let sent = Sent {
                                    holder: probe.to_owned(),
                                    kind,
                                    attempt: format!("{probe}#1"),
                                    lease: LONG,
                                    fencing: kind.owns(),
                                    queue: None,
                                    contended: false,
                                    within: None,
                                };
                                let release = Op::Release {
                                    kind,
                                    grant: sent.attempt.clone(),
                                    token: TokenArg::Known,
                                    handoff: None,
                                };
                                queued.push(Step::new(Op::Acquire(sent), Why::Probe));
                                queued.push(Step::new(release, Why::Probe));
                            }
                        }
                        _ => break,
                    }
                    queued.reverse();
                    continue;
                }
            },
        };
        let t = match step.op {
            Op::Expire => plan.after_every_end(),
            _ => {
                let gap = match gaps.below(20) {
                    0..=13 => gaps.millis(2, 5),
                    14..=18 => gaps.millis(6, 30),
                    _ => gaps.millis(40, 90),
                };
                let planned = plan.next(gap);
                plan.catch_up(planned, start.elapsed())
            }
        };
        plan.ends(t, &step.op);
        if step.why == Why::Probe
            && let Op::Acquire(sent) = &step.op
            && !model.free_for(sent.kind, t)
        {
            let view = model_view(&mut model, t);
            return Err(Failure {
                report: format!(
                    "seed {seed}, try {try_}: the model still keeps {:?} taken at the end\n{view}\n{log}",
                    sent.kind
                ),
                overran: false,
            });
        }
        // The step starts once its time has come on the server's clock too.
        let due = start + t;
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
        }
        // Exactly there: a timer would round it to the clock's millisecond ticks.
        runtime.block_on(async {
            let now = tokio::time::Instant::now();
            tokio::time::advance((origin + t).saturating_duration_since(now)).await;
        });
        let on_memory = runtime.block_on(perform(&memory, &keys, &step.op, &tokens.0));
        let on_redis =
            fixture.runtime.block_on(perform(&fixture.redis, &keys, &step.op, &tokens.1));
        let views_memory = runtime.block_on(inspect_all(&memory, &keys));
        let views_redis = fixture.runtime.block_on(inspect_all(&fixture.redis, &keys));
        // What timing decides is over: the server's answer and what it reports after it.
        let done = start.elapsed();
        let published = fixture.subscriber.drain();
        let untimed = fixture.keys_without_ttl();
        let heard_memory = ears.heard();
        stats.steps += 1;
        *stats.ran.entry(step.op.name().to_owned()).or_default() += 1;
        *stats.ran.entry(format!("({:?})", step.why)).or_default() += 1;
        // Judged before anything is compared: the server ran this step from `t` to `done`.
        let overran = windows.iter().any(|(from, to)| *from <= done && *to >= t);
        stats.overran |= overran;
        tolerance = tolerance.max(done.saturating_sub(t) + Duration::from_millis(3));
        for length in step.op.ends().into_iter().filter(|length| *length < LONG) {
            windows.push((t + length - EARLY, done + length + LATE));
        }
        windows.retain(|(_, to)| *to >= t);
        let mut messages: HashMap<Lk, Vec<String>> = HashMap::new();
        for (channel, message) in published {
            match keys.channel(&channel) {
                Some(lock) => messages.entry(lock).or_default().push(message),
                None => continue,
            }
        }
        let _ = writeln!(
            log,
            "{index:>3} {:>8.1}ms {:<9} {}{}\n              memory {:?} | Redis {:?}{}",
            t.as_secs_f64() * 1e3,
            format!("{:?}", step.why),
            step.op,
            if overran {
                format!("  (ran into a lease's end; done {:.1}ms)", done.as_secs_f64() * 1e3)
            } else {
                String::new()
            },
            on_memory,
            on_redis,
            if messages.is_empty() { String::new() } else { format!("  published {messages:?}") }
        );
        let fail = |what: String,
                    overran: bool,
                    model: &str,
                    log: &str|
         -> Result<Stats, Failure> {
            Err(Failure {
                report: format!(
                    "seed {seed}, try {try_}, step {index} at {:.1}ms: {what}\nthe model before \
                     that step:\n{model}\n{log}",
                    t.as_secs_f64() * 1e3
                ),
                overran,
            })
        };
        // The memory store against the model: exact, whatever the machine's speed.
        let before = model_view(&mut model, t);
        let (expected, effects) = model.step(&step.op, t);
        if !expected.close(&on_memory, Duration::ZERO) {
            let what = why_not(&step.op, step.why, &expected, &on_memory);
            return fail(format!("memory store: {what}"), false, &before, &log);
        }
        let views: Vec<View> = LOCKS.iter().map(|lock| model.view(*lock, t)).collect();
        for ((lock, expected), view) in LOCKS.iter().zip(&views).zip(&views_memory) {
            if view.as_ref() != Ok(expected) {
                return fail(
                    format!(
                        "memory store: inspect of {lock:?} reports {view:?}, the model keeps \
                         {expected:?}"
                    ),
                    false,
                    &before,
                    &log,
                );
            }
        }
        for lock in LOCKS {
            let heard = heard_memory.get(&lock).cloned().unwrap_or_default();
            let publish = effects.publish.get(&lock).cloned().unwrap_or_default();
            if let Err(what) = check_heard(&heard, &publish) {
                return fail(format!("memory store, {lock:?}: {what}"), false, &before, &log);
            }
        }
        if let Err(what) = check_tokens(&mut tokens.0, &effects, &on_memory, &step.op) {
            return fail(format!("memory store: {what}"), false, &before, &log);
        }
        // The server against the memory store, and against the model where it tells exactly.
        if !untimed.is_empty() {
            return fail(
                format!("TTL: keys without a TTL on the server: {untimed:?}"),
                false,
                &before,
                &log,
            );
        }
        let mut disagreement = None;
        if !on_memory.close(&on_redis, tolerance) {
            disagreement = Some(format!(
                "the stores disagree: memory {on_memory:?}, Redis {on_redis:?} (tolerance \
                 {tolerance:?})"
            ));
        }
        for ((lock, memory), redis) in LOCKS.iter().zip(&views_memory).zip(&views_redis) {
            let same = match (memory, redis) {
                (Ok(a), Ok(b)) => a.close(b, tolerance),
                _ => false,
            };
            if disagreement.is_none() && !same {
                disagreement = Some(format!(
                    "inspect of {lock:?} disagrees: memory {memory:?}, Redis {redis:?}"
                ));
            }
        }
        for lock in LOCKS {
            let published = messages.get(&lock).cloned().unwrap_or_default();
            let heard = heard_memory.get(&lock).cloned().unwrap_or_default();
            let publish = effects.publish.get(&lock).cloned().unwrap_or_default();
            let wrong = check_messages(&published, &publish).err().or_else(|| {
                (Heard::of(&published) != heard).then(|| {
                    format!("the memory store's listeners heard {heard:?}, Redis published {published:?}")
                })
            });
            if disagreement.is_none()
                && let Some(wrong) = wrong
            {
                disagreement = Some(format!("Redis, {lock:?}: {wrong}"));
            }
        }
        if disagreement.is_none()
            && let Err(what) = check_tokens(&mut tokens.1, &effects, &on_redis, &step.op)
        {
            disagreement = Some(format!("Redis: {what}"));
        }
        if let Some(what) = disagreement {
            return fail(what, overran, &before, &log);
        }
    }
    Ok(stats)
}

/// Whether what the memory store's listeners heard fits what the step should publish.
fn check_heard(heard: &Heard, publish: &Publish) -> Result<(), String> {
    let allowed: Vec<&String> = publish.must.iter().chain(&publish.may).collect();
    match &publish.must {
        Some(message) if message == RELEASED && !heard.any => {
            return Err("Wake-up: the lock was freed and nobody heard of it".to_owned());
        }
        Some(message) if message != RELEASED && !heard.named.contains(message) => {
            return Err(format!("Wake-up: the queue's head {message} was not woken"));
        }
        _ => {}
    }
    if heard.any && allowed.is_empty() {
        return Err(format!("published when nothing was freed: {heard:?}"));
    }
    if let Some(name) = heard.named.iter().find(|name| !allowed.contains(name)) {
        return Err(format!("woke {name}, who is not the queue's head (allowed: {allowed:?})"));
    }
    Ok(())
}

/// Whether the messages the server published fit what the step should publish.
fn check_messages(messages: &[String], publish: &Publish) -> Result<(), String> {
    if let Some(message) = &publish.must
        && !messages.contains(message)
    {
        return Err(format!("Wake-up: expected {message:?} to be published, got {messages:?}"));
    }
    let allowed: Vec<&String> = publish.must.iter().chain(&publish.may).collect();
    if let Some(extra) = messages.iter().find(|message| !allowed.contains(message)) {
        return Err(format!("published {extra:?}, not one of {allowed:?} (all: {messages:?})"));
    }
    if messages.len() > 1 {
        return Err(format!("published more than once: {messages:?}"));
    }
    Ok(())
}

/// Checks the tokens of `answer` as the model's `effects` expect them, and records them.
fn check_tokens(
    tokens: &mut Tokens,
    effects: &Effects,
    answer: &Answer,
    op: &Op,
) -> Result<(), String> {
    let token = match answer {
        Answer::Acquired(token) | Answer::Extended(token) | Answer::HandedOff(token) => *token,
        _ => None,
    };
    for event in &effects.tokens {
        tokens.check(event, token)?;
    }
    let expected = effects.tokens.iter().any(|event| !matches!(event, TokenEvent::Cleared(_)));
    if !expected && token.is_some() {
        return Err(format!("a token nobody asked for, after {op}"));
    }
    Ok(())
}

/// The model's view of every lock at `t`, for a failure's report.
fn model_view(model: &mut Model, t: Duration) -> String {
    let mut view = String::new();
    for lock in LOCKS {
        let owner = model.owner(lock, t).cloned();
        let shared = model.shared(lock, t).clone();
        let places = model.places.get(&lock).cloned().unwrap_or_default();
        let void = model.void.get(&lock).cloned().unwrap_or_default();
        let _ = writeln!(
            view,
            "  {lock:?}: owner {owner:?}\n    shared {:?} (key until {:?})\n    places {places:?}\n    void {:?} until {:?}",
            shared.members, shared.until, void.attempts, void.until
        );
    }
    view
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value.parse().unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
    })
}

/// Runs the programs of the seeds the environment names (20 by default) on both stores.
#[test]
fn both_stores_answer_every_program_alike() {
    let steps = env_u64("DIFFERENTIAL_STEPS").map_or(40, |steps| steps as usize);
    let seeds = match env_u64("DIFFERENTIAL_SEED") {
        Some(seed) => seed..seed + 1,
        None => {
            let first = env_u64("DIFFERENTIAL_FIRST_SEED").unwrap_or(1);
            first..first + env_u64("DIFFERENTIAL_SEEDS").unwrap_or(20)
        }
    };
    let one = seeds.end - seeds.start == 1;
    let mut fixture = Fixture::start();
    let started = Instant::now();
    let (mut failures, mut ran, mut overran, mut tries) = (Vec::new(), 0, 0, 0);
    let mut kinds = std::collections::BTreeMap::new();
    for seed in seeds {
        // A program that failed after a step ran into a lease's end on the server (a busy
        // machine) is run again under new lock names: the same steps, other timing.
        for try_ in 1..=TRIES {
            tries += 1;
            match compare(seed, try_, &mut fixture, steps) {
                Ok(stats) => {
                    ran += stats.steps;
                    for (what, count) in stats.ran {
                        *kinds.entry(what).or_insert(0) += count;
                    }
                    overran += usize::from(stats.overran);
                    break;
                }
                Err(failure) if failure.overran && try_ < TRIES => {
                    eprintln!("seed {seed}: a step ran into a lease's end on the server; again");
                    if one {
                        eprintln!("{}", failure.report);
                    }
                }
                Err(failure) => {
                    if failures.is_empty() {
                        eprintln!("{}", failure.report);
                    }
                    failures.push(seed);
                    break;
                }
            }
        }
    }
    println!(
        "differential: {ran} steps in {tries} runs, {overran} of them near a lease's end on the \
         server, in {:.1} s\n  {kinds:?}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "failing seeds: {failures:?} (the first one's steps are above); replay one with \
         DIFFERENTIAL_SEED=<seed> cargo test --lib --all-features differential -- --nocapture"
    );
}
