//! Release notifications gathered from every node.
//!
//! A real release is published by every node that held the lock, so by a majority. An
//! attempt given back after a lost vote is published only by the nodes it took, fewer than a
//! majority; waking on those would send every contender of a split vote straight back into the
//! next collision and defeat the random retry delay. So the combined listener wakes once a
//! majority of distinct nodes have notified since it last woke. When a release reaches fewer
//! (nodes down), the waiter still retries at the lease's end, as after any missed notification.

use std::sync::{Mutex, PoisonError};

use futures_util::future::select_all;

use crate::backend::{Listener, store::Listen};

/// A registration for release notifications of one lock on every node of a
/// [`RedlockBackend`](super::RedlockBackend); dropping it unregisters on every node.
#[derive(Debug)]
pub struct RedlockListener {
    nodes: Vec<Listener>,
    /// Which nodes notified since the last wake-up (bit per node).
    heard: Mutex<u64>,
    quorum: usize,
}

impl RedlockListener {
    pub(super) fn new(nodes: Vec<Listener>, quorum: usize) -> Self {
        Self { nodes, heard: Mutex::new(0), quorum }
    }

    /// Records a notification from `node`; true when a majority has now been heard (and
    /// starts counting afresh).
    fn heard_from(&self, node: usize) -> bool {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        *heard |= 1 << node;
        if heard.count_ones() as usize >= self.quorum {
            *heard = 0;
            return true;
        }
        false
    }

    fn is_heard(&self, node: usize) -> bool {
        *self.heard.lock().unwrap_or_else(PoisonError::into_inner) & (1 << node) != 0
    }
}

impl Listen for RedlockListener {
    async fn notified(&self) {
        loop {
            // Each node's listener keeps its own permit, so dropping the futures of the nodes
            // that did not fire loses nothing.
            let pending =
                self.nodes.iter().enumerate().filter(|(node, _)| !self.is_heard(*node)).map(
                    |(node, listener)| {
                        Box::pin(async move {
                            listener.notified().await;
                            node
                        })
                    },
                );
            let (node, _, _) = select_all(pending).await;
            if self.heard_from(node) {
                return;
            }
        }
    }
}
