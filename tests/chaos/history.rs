//! The history of critical sections: one JSON line per section, appended with a single
//! `O_APPEND` `write()` so lines from several processes never interleave.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    path::Path,
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use crate::clock;

/// How a section ended, as in Jepsen: `info` is indeterminate (the holder was killed, or the
/// outcome of its acquire is unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Outcome {
    Ok,
    Fail,
    Info,
}

/// One critical section (or one failed attempt at one). Times are `CLOCK_MONOTONIC` ns.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Section {
    pub(crate) scenario: String,
    pub(crate) key: String,
    pub(crate) holder: String,
    pub(crate) pid: u32,
    pub(crate) token: Option<u64>,
    /// The acquire was called.
    pub(crate) t_inv: u64,
    /// The acquire returned the lock.
    pub(crate) t_ok: Option<u64>,
    /// The release was called.
    pub(crate) t_rel_inv: Option<u64>,
    /// The release returned.
    pub(crate) t_rel_ok: Option<u64>,
    /// The holder learned the lock was lost (`lost()` resolved, or the process was killed).
    pub(crate) t_lost: Option<u64>,
    /// The latest lease deadline the guard promised (`now + remaining()` at a check): past it
    /// the holder may not believe it holds, even if a paused process learns of the loss later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) t_deadline: Option<u64>,
    pub(crate) result: Outcome,
}

impl Section {
    /// A section whose acquire is being called now.
    pub(crate) fn begin(scenario: &str, key: &str, holder: &str) -> Self {
        Self {
            scenario: scenario.to_owned(),
            key: key.to_owned(),
            holder: holder.to_owned(),
            pid: std::process::id(),
            token: None,
            t_inv: clock::now_ns(),
            t_ok: None,
            t_rel_inv: None,
            t_rel_ok: None,
            t_lost: None,
            t_deadline: None,
            result: Outcome::Info,
        }
    }

    /// When the holder stopped believing it held the lock: the release call, the loss or the
    /// recorded deadline, whichever came first; `u64::MAX` when none was recorded (it never let
    /// go).
    pub(crate) fn believed_until(&self) -> u64 {
        [self.t_rel_inv, self.t_lost, self.t_deadline]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Its acquire failed with `error`: indeterminate when the store failed (the attempt may
    /// have taken the lock all the same), a failure otherwise.
    pub(crate) fn acquire_failed(&mut self, error: &tower_lock::LockError) {
        self.result = match error {
            tower_lock::LockError::Backend(_) => Outcome::Info,
            _ => Outcome::Fail,
        };
    }

    /// Its release returned at `t_rel_ok`, `released` telling whether it succeeded: the
    /// section is ok only when it did and no loss was seen.
    pub(crate) fn release_returned(&mut self, t_rel_ok: u64, released: bool) {
        self.t_rel_ok = Some(t_rel_ok);
        self.result = if released && self.t_lost.is_none() { Outcome::Ok } else { Outcome::Fail };
    }

    /// Written when the acquire returned, before the section's end is known: the only trace
    /// of a section whose process is killed.
    pub(crate) fn is_open(&self) -> bool {
        self.t_ok.is_some() && self.t_rel_inv.is_none() && self.t_lost.is_none()
    }
}

/// An append-only history file. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct History {
    file: Arc<File>,
    scenario: Arc<str>,
}

impl History {
    /// Opens (creating) the history at `path` for sections of `scenario`.
    pub(crate) fn open(path: &Path, scenario: &str) -> Self {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open history {}: {e}", path.display()));
        Self { file: Arc::new(file), scenario: scenario.into() }
    }

    /// A section of this history's scenario whose acquire is being called now.
    pub(crate) fn begin(&self, key: &str, holder: &str) -> Section {
        Section::begin(&self.scenario, key, holder)
    }

    /// Appends one section in one `write()`.
    pub(crate) fn record(&self, section: &Section) {
        let mut line = serde_json::to_vec(section).expect("a section serialises");
        line.push(b'\n');
        assert!(line.len() <= 4096, "history lines stay within one page");
        let written = (&*self.file).write(&line).expect("append to the history");
        assert_eq!(written, line.len(), "a history line was written in parts");
    }

    /// Every section recorded at `path` so far, by every process.
    pub(crate) fn read(path: &Path) -> Vec<Section> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("bad history line {line:?}: {e}"))
            })
            .collect()
    }
}
