//! What the nodes of a Redlock backend say a lock holds, as one answer.
//!
//! Each node is asked on its own; a holder is one that enough nodes name. For
//! an inspection that is a majority: a hold that a minority of the nodes
//! still has (an attempt that lost its vote, waiting out its lease there) holds nothing, since
//! no one can act on it. For a forced unlock, which clears every
//! node, it is any node: the answer says what was cleared anywhere.

use std::time::Duration;

use super::vote::NodeResult;
use crate::{
    backend::LockKind,
    inspect::{HolderInfo, LockInfo},
};

/// Joins the nodes' snapshots: the holders at least `at_least` nodes name, each with the hold
/// count and the lease that many nodes still have (the `at_least`-th highest); the longest
/// queue. `Err(reachable)` when fewer than `quorum` nodes answered.
pub(super) fn join(
    replies: &[NodeResult<LockInfo>],
    at_least: usize,
    quorum: usize,
) -> Result<LockInfo, usize> {
    let answers: Vec<&LockInfo> = replies.iter().filter_map(|r| r.as_ref().ok()).collect();
    if answers.len() < quorum {
        return Err(answers.len());
    }
    let mut seen: Vec<(&str, LockKind)> = Vec::new();
    for holder in answers.iter().flat_map(|info| &info.holders) {
        if !seen.contains(&(holder.id.as_str(), holder.kind)) {
            seen.push((holder.id.as_str(), holder.kind));
        }
    }
    let mut joined = LockInfo::free()
        .with_queue_len(answers.iter().map(|info| info.queue_len).max().unwrap_or(0));
    for (id, kind) in seen {
        let on_nodes: Vec<&HolderInfo> = answers
            .iter()
            .filter_map(|info| {
                let mut holders = info.holders.iter();
                holders.find(|h| h.id == id && h.kind == kind)
            })
            .collect();
        if on_nodes.len() < at_least.max(1) {
            continue;
        }
        let nth = at_least.max(1) - 1;
        let mut counts: Vec<u64> = on_nodes.iter().map(|h| h.hold_count).collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        // No expiry (`None`) outlasts every lease.
        let mut leases: Vec<Duration> =
            on_nodes.iter().map(|h| h.remaining_lease.unwrap_or(Duration::MAX)).collect();
        leases.sort_unstable_by(|a, b| b.cmp(a));
        let lease = Some(leases[nth]).filter(|lease| *lease != Duration::MAX);
        joined = joined.with_holder(HolderInfo::new(id, kind, counts[nth], lease));
    }
    Ok(joined)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{BackendError, BackendErrorKind};

    fn held(id: &str, count: u64, ms: u64) -> NodeResult<LockInfo> {
        let lease = Some(Duration::from_millis(ms));
        Ok(LockInfo::free().with_holder(HolderInfo::new(id, LockKind::Exclusive, count, lease)))
    }

    fn down() -> NodeResult<LockInfo> {
        Err(BackendError::from_kind(BackendErrorKind::Unavailable))
    }

    /// A majority names the holder: it is reported with what a majority still has; a hold on
    /// a minority of the nodes is not.
    #[test]
    fn a_majority_makes_the_holder() {
        let replies = [held("a", 2, 900), held("a", 1, 1000), held("b", 1, 500)];
        let info = join(&replies, 2, 2).unwrap();
        assert_eq!(info.holders.len(), 1);
        let a = &info.holders[0];
        assert_eq!((a.id.as_str(), a.hold_count), ("a", 1));
        assert_eq!(a.remaining_lease, Some(Duration::from_millis(900)));
    }

    /// What any node cleared is reported when one node is enough.
    #[test]
    fn any_node_counts_for_a_forced_unlock() {
        let replies = [held("a", 1, 900), Ok(LockInfo::free()), held("b", 1, 500)];
        let info = join(&replies, 1, 2).unwrap();
        assert_eq!(info.holders.len(), 2);
    }

    /// Fewer answers than a majority: no answer.
    #[test]
    fn without_a_quorum_there_is_no_answer() {
        let replies = [held("a", 1, 900), down(), down()];
        assert_eq!(join(&replies, 2, 2), Err(1));
    }
}
