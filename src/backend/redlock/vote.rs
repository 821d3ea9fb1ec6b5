//! Turning the replies of every node into one answer.
//!
//! Pure functions over per-node results, so the quorum rules are stated (and tested) apart from
//! the network calls. A node that failed counts as not having answered.

use std::time::Duration;

use crate::{
    backend::store::{AcquireReply, ReleaseReply, RenewReply},
    error::{BackendError, BackendErrorKind},
};

/// One node's result of one call.
pub(super) type NodeResult<T> = Result<T, BackendError>;

/// What a round of acquires on every node amounts to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AcquireVote {
    /// A majority granted it.
    Won,
    /// A majority answered but did not grant it. With `blocked`, a majority is held by another
    /// holder and frees up after `ttl`; otherwise the vote was split.
    Lost { blocked: bool, ttl: Option<Duration> },
    /// Fewer than a majority answered.
    NoQuorum { reachable: usize },
}

/// Tallies one acquire round. `quorum` is the majority of all nodes.
pub(super) fn acquire(replies: &[NodeResult<AcquireReply>], quorum: usize) -> AcquireVote {
    let reachable = replies.iter().filter(|reply| reply.is_ok()).count();
    let granted =
        replies.iter().filter(|reply| matches!(reply, Ok(AcquireReply::Acquired { .. }))).count();
    if granted >= quorum {
        return AcquireVote::Won;
    }
    if reachable < quorum {
        return AcquireVote::NoQuorum { reachable };
    }
    let mut held: Vec<Option<Duration>> = replies
        .iter()
        .filter_map(|reply| match reply {
            Ok(AcquireReply::Held { ttl }) => Some(*ttl),
            _ => None,
        })
        .collect();
    let nodes = replies.len();
    // The lock can be taken once no more than `nodes - quorum` nodes still hold it.
    let must_expire = (held.len() + quorum).saturating_sub(nodes);
    if must_expire == 0 {
        return AcquireVote::Lost { blocked: false, ttl: None };
    }
    // Unknown expiries (`None`) sort last: they never free up on their own.
    held.sort_unstable_by_key(|ttl| ttl.unwrap_or(Duration::MAX));
    AcquireVote::Lost { blocked: true, ttl: held[must_expire - 1] }
}

/// Whether an acquire round can stop listening to the replies so far (`None`: not answered
/// yet): a majority granted it, or every node answered. A round that is not won waits for
/// every node (each within its timeout), so that what the slow ones took is given back before
/// the engine tries again: its waiter then waits for a release notification, which the
/// listener keeps, so answering earlier would not make it acquire sooner.
pub(super) fn acquire_decided(replies: &[Option<NodeResult<AcquireReply>>], quorum: usize) -> bool {
    let granted = replies
        .iter()
        .flatten()
        .filter(|reply| matches!(reply, Ok(AcquireReply::Acquired { .. })))
        .count();
    granted >= quorum || replies.iter().all(Option::is_some)
}

/// Tallies a release on every node: released when any node had the grant; not held only when
/// a majority answered that they had not. Fails with the number of nodes that answered when
/// that is too few to tell.
pub(super) fn release(
    replies: &[NodeResult<ReleaseReply>],
    quorum: usize,
) -> Result<ReleaseReply, usize> {
    let reachable = replies.iter().filter(|reply| reply.is_ok()).count();
    let mut freed = false;
    let mut notified: Option<u64> = None;
    for reply in replies {
        match reply {
            Ok(ReleaseReply::Released { notified: n }) => {
                freed = true;
                notified = notified.max(*n);
            }
            Ok(ReleaseReply::HandedOff { .. }) => freed = true,
            _ => {}
        }
    }
    if freed {
        return Ok(ReleaseReply::Released { notified });
    }
    if reachable < quorum {
        // No answering node had it, but the silent ones may: it cannot be called not held.
        return Err(reachable);
    }
    Ok(ReleaseReply::NotHeld)
}

/// Tallies a renewal batch: per entry, renewed only on a majority of the nodes. Fails with the
/// number of nodes that answered when fewer than a majority did.
pub(super) fn renew(
    replies: &[NodeResult<Vec<RenewReply>>],
    entries: usize,
    quorum: usize,
) -> Result<Vec<RenewReply>, usize> {
    let answered: Vec<&Vec<RenewReply>> = replies
        .iter()
        .filter_map(|reply| reply.as_ref().ok())
        .filter(|batch| batch.len() == entries)
        .collect();
    if answered.len() < quorum {
        return Err(answered.len());
    }
    Ok((0..entries)
        .map(|entry| {
            let renewed =
                answered.iter().filter(|batch| batch[entry] == RenewReply::Renewed).count();
            if renewed >= quorum { RenewReply::Renewed } else { RenewReply::NotHeld }
        })
        .collect())
}

/// The error for a round that fewer than `quorum` nodes answered, carrying the first node
/// error as its source; a node error that no retry can fix (foreign data, permissions) is
/// returned as it is.
pub(super) fn no_quorum<T>(
    replies: Vec<NodeResult<T>>,
    reachable: usize,
    quorum: usize,
) -> BackendError {
    let mut errors = replies.into_iter().filter_map(Result::err);
    let mut first = None;
    for error in errors.by_ref() {
        if matches!(
            error.kind(),
            BackendErrorKind::WrongType { .. } | BackendErrorKind::NoPermission
        ) {
            return error;
        }
        first.get_or_insert(error);
    }
    let kind = BackendErrorKind::QuorumUnavailable { reachable, needed: quorum };
    match first {
        Some(source) => BackendError::new(kind, source),
        None => BackendError::from_kind(kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquired(_node: u64) -> NodeResult<AcquireReply> {
        Ok(AcquireReply::Acquired { token: None })
    }

    fn held(ms: u64) -> NodeResult<AcquireReply> {
        Ok(AcquireReply::Held { ttl: Some(Duration::from_millis(ms)) })
    }

    fn down<T>() -> NodeResult<T> {
        Err(BackendError::from_kind(BackendErrorKind::Timeout))
    }

    #[test]
    fn a_majority_of_grants_wins() {
        let replies = [acquired(1), acquired(2), acquired(3), down(), held(5)];
        assert_eq!(acquire(&replies, 3), AcquireVote::Won);
        let replies = [acquired(1), acquired(2), held(5), down(), held(5)];
        assert_ne!(acquire(&replies, 3), AcquireVote::Won);
    }

    #[test]
    fn a_round_is_decided_by_a_majority_of_grants_or_every_answer() {
        let pending = || None;
        // Three grants of five: won, whatever the other two say later.
        let won = [Some(acquired(1)), pending(), Some(acquired(1)), pending(), Some(acquired(1))];
        assert!(acquire_decided(&won, 3));
        // Not won yet: the rest decide, or must be given back if they took it.
        let open = [Some(acquired(1)), Some(held(5)), Some(acquired(1)), Some(down()), pending()];
        assert!(!acquire_decided(&open, 3));
        let lost = [Some(held(5)), Some(down()), pending(), Some(held(5)), Some(held(5))];
        assert!(!acquire_decided(&lost, 3));
        let all =
            [Some(acquired(1)), Some(acquired(1)), Some(held(5)), Some(held(5)), Some(down())];
        assert!(acquire_decided(&all, 3));
    }

    #[test]
    fn a_split_vote_is_lost_without_a_wait() {
        let replies = [acquired(1), acquired(1), held(900), held(900), down()];
        let vote = acquire(&replies, 3);
        assert_eq!(vote, AcquireVote::Lost { blocked: false, ttl: None });
    }

    #[test]
    fn a_lock_held_on_a_majority_frees_when_enough_leases_ran_out() {
        let replies = [held(100), held(300), held(200), held(400), held(500)];
        let vote = acquire(&replies, 3);
        // Three nodes free (100, 200, 300 ms) make a majority.
        let ttl = Some(Duration::from_millis(300));
        assert_eq!(vote, AcquireVote::Lost { blocked: true, ttl });
    }

    #[test]
    fn fewer_answers_than_a_majority_is_no_quorum() {
        let replies = [acquired(1), acquired(1), down(), down(), down()];
        assert_eq!(acquire(&replies, 3), AcquireVote::NoQuorum { reachable: 2 });
    }

    #[test]
    fn release_frees_when_any_node_freed() {
        let replies = [
            Ok(ReleaseReply::Released { notified: Some(1) }),
            Ok(ReleaseReply::Released { notified: Some(3) }),
            Ok(ReleaseReply::NotHeld),
            down(),
            down(),
        ];
        let reply = release(&replies, 3).expect("answer");
        assert_eq!(reply, ReleaseReply::Released { notified: Some(3) });
    }

    #[test]
    fn release_is_not_held_only_when_a_majority_says_so() {
        let replies =
            [Ok(ReleaseReply::NotHeld), Ok(ReleaseReply::NotHeld), down(), down(), down()];
        assert!(release(&replies, 3).is_err());
        let replies = [
            Ok(ReleaseReply::NotHeld),
            Ok(ReleaseReply::NotHeld),
            Ok(ReleaseReply::NotHeld),
            down(),
            down(),
        ];
        assert_eq!(release(&replies, 3).expect("answer"), ReleaseReply::NotHeld);
    }

    #[test]
    fn renewal_needs_a_majority_per_entry() {
        use RenewReply::{NotHeld, Renewed};
        let replies = [
            Ok(vec![Renewed, Renewed]),
            Ok(vec![Renewed, NotHeld]),
            Ok(vec![Renewed, Renewed]),
            down(),
            down(),
        ];
        assert_eq!(renew(&replies, 2, 3).expect("quorum"), vec![Renewed, NotHeld]);
        assert!(renew(&replies[1..], 2, 3).is_err());
    }
}
